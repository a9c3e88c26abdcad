//! A deployment's page (SPEC 9, 10) over the demo's sample, whose deployments were snapshotted
//! as they were sent: reached from the environment page in a real browser (headless
//! Chromium), showing the image a deployment changed; what a viewer without `user_access`
//! reads instead; bad input. Screenshots under `target/browser/`.

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};

use crate::support::browser::{Browser, Page};
use crate::support::demo::Demo;

fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/browser")
}

async fn check(page: &Page<'_>, name: &str, result: Result<(), String>) {
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

const SHOP: &str = "/environments?project=acme/platform/shop&name=production";
const OLD: &str = "registry.acme.test/shop/web:1.4.1";
const NEW: &str = "registry.acme.test/shop/web:1.4.2";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_page_from_the_environment_shows_the_image_it_changed_in_chromium() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let demo = Demo::start().await;
    let page = browser.page().await;
    page.screen(1440, false).await;
    demo.sign_in(&page).await;

    // The environment lists its deployments with their time to healthy; #6 failed, so it has
    // no snapshot.
    page.goto(&format!("{}{SHOP}", demo.url)).await;
    let r = page
        .wait_for(
            "document.querySelectorAll('#deployments tbody tr').length >= 8",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "deployments-list", r).await;
    let rows = page
        .eval("[...document.querySelectorAll('#deployments tbody tr')].map(r => r.innerText)")
        .await;
    let rows: Vec<String> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let row = |iid: &str| {
        rows.iter()
            .find(|r| r.starts_with(&format!("#{iid}")))
            .unwrap_or_else(|| panic!("no deployment #{iid} in {rows:?}"))
    };
    assert!(row("8").contains("under 1 s"), "{rows:?}");
    assert!(row("6").contains("no snapshot"), "{rows:?}");

    // Deployment #7 rolled the web app and the worker to 1.4.2 (#6, which tried, failed).
    page.eval("location.href = [...document.querySelectorAll('#deployments a')].find(a => a.innerText === '#7').href").await;
    let r = page
        .wait_for(
            "document.querySelector('h1') && document.querySelector('h1').innerText === 'Deployment #7'",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "deployment", r).await;
    let images = page
        .eval("[...document.querySelectorAll('tr.image')].map(r => [...r.querySelectorAll('td')].map(td => td.innerText.trim()))")
        .await;
    let web = images
        .as_array()
        .unwrap()
        .iter()
        .find(|cells| cells[0].as_str().unwrap().contains("web"))
        .unwrap_or_else(|| panic!("no image change of web: {images}"));
    assert!(web[2].as_str().unwrap().contains(OLD), "{web}");
    assert!(web[3].as_str().unwrap().contains(NEW), "{web}");
    let text = page.text().await;
    for expected in [
        "Compared with deployment #5",
        "Time to healthy",
        "Health when settled",
        "Environment's health now",
        "/spec/template/spec/containers/0/image",
    ] {
        assert!(text.contains(expected), "{expected} missing:\n{text}");
    }
    // Its base, one link away.
    let base = page
        .eval("[...document.querySelectorAll('a')].find(a => a.innerText === 'deployment #5').href")
        .await;
    assert!(base.as_str().unwrap().ends_with("iid=5"), "{base}");

    // A phone's width and a desktop's, light and dark: nothing wider than the screen. The
    // environment's deployments too (the end of its page).
    let url = page.url().await;
    let environment = format!("{}{SHOP}#deployments", demo.url);
    for (what, url) in [
        ("deployment", &url),
        ("environment-deployments", &environment),
    ] {
        for width in [390, 1440] {
            for dark in [false, true] {
                page.screen(width, dark).await;
                page.goto(url).await;
                let name = format!("{what}-{width}-{}", if dark { "dark" } else { "light" });
                page.screenshot(&shots().join(format!("{name}.png"))).await;
                let r = page
                    .wait_for(
                        "document.documentElement.scrollWidth <= window.innerWidth + 1",
                        Duration::from_secs(2),
                    )
                    .await;
                check(&page, &format!("{name}-width"), r).await;
            }
        }
    }
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

#[tokio::test]
async fn the_deployment_page_reads_as_the_api_answers_the_viewer() {
    let demo = Demo::start().await;
    const ALICE: i64 = 2;
    const CAROL: i64 = 4;

    // Rendered on the server: the changes are in the HTML, no script needed.
    let res = get_as(
        &demo,
        ALICE,
        "/deployments?project=acme/platform/shop&iid=7",
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let html = res.text();
    assert!(html.contains(OLD) && html.contains(NEW), "{html}");
    assert!(html.contains("<del"), "{html}");
    // Nothing changed between #7 and #8.
    let html = get_as(
        &demo,
        ALICE,
        "/deployments?project=acme/platform/shop&iid=8",
    )
    .await
    .text();
    assert!(html.contains("Nothing changed in the resources."), "{html}");
    // The first deployment compares with nothing; the failed one has no snapshot.
    let html = get_as(
        &demo,
        ALICE,
        "/deployments?project=acme/platform/shop&iid=1",
    )
    .await
    .text();
    assert!(html.contains("everything is new"), "{html}");
    let html = get_as(
        &demo,
        ALICE,
        "/deployments?project=acme/platform/shop&iid=6",
    )
    .await
    .text();
    assert!(html.contains("No snapshot"), "{html}");

    // carol reads acme/web/site's deployments, but not its agent's resources: the page says so.
    let res = get_as(&demo, CAROL, "/deployments?project=acme/web/site&iid=8").await;
    assert_eq!(res.status, 200, "{}", res.text());
    let html = res.text();
    assert!(
        html.contains("What this deployment changed is not shown"),
        "{html}"
    );
    assert!(html.contains("user_access"), "{html}");
    assert!(!html.contains("registry.acme.test"), "{html}");
    // And the environment's list says it without a time.
    let html = get_as(
        &demo,
        CAROL,
        "/environments?project=acme/web/site&name=production",
    )
    .await
    .text();
    assert!(html.contains("needs access to the agent"), "{html}");

    // Bad input: a clear 400 or 404, never a 5xx.
    for (path, status) in [
        ("/deployments?project=acme/platform/shop", 400),
        ("/deployments?project=acme/platform/shop&iid=seven", 400),
        ("/deployments?project=acme/platform/shop&iid=-1", 400),
        ("/deployments?project=acme/platform/shop&iid=99", 404),
        ("/deployments?project=acme/nowhere&iid=1", 404),
    ] {
        let res = get_as(&demo, ALICE, path).await;
        assert_eq!(res.status, status, "{path}: {}", res.text());
    }
}
