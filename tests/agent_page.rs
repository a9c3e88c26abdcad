//! The dashboard's agent page (SPEC 14's `ClusterAgent.connection`, SPEC 9): who sees it
//! (GitLab's `read_cluster_agent`; to anyone else it is the 404 of a missing agent), what it
//! shows through a kubeconfig and through GitLab's agent server, the links that lead to it, and
//! the page at a phone's and a desktop's width following its connection without a reload.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request};
use serde_json::{json, Value};

use crate::dashboard::{check, check_contrast, shots};
use crate::support::browser::Browser;
use crate::support::demo::Demo;
use crate::support::environment::{self, SLUG};
use crate::support::kas::{through_kas, ThroughKas};
use crate::support::kube_api::KubeApi;
use crate::support::TestApp;

const ROOT: i64 = 1;
/// Developer of acme/apps/web: `ci_access` (the group acme/apps) and `user_access` serve them.
const DEV: i64 = 2;
/// Reporter of acme/apps/web: reads its environments, not the agent.
const REP: i64 = 3;
const AGENT: i64 = 7;
const PAGE: &str = "/agents?project=acme/agents&name=prod";

/// The agent's configuration: `ci_access` names the group acme/apps and the private project
/// acme/agents (which dev may not read); `user_access` the project acme/apps/web.
fn agent_config(access_as: &str) -> Value {
    json!({"ci_access": {"groups": [{"id": "acme/apps"}], "projects": [{"id": "acme/agents"}]},
        "user_access": {"access_as": {access_as: {}}, "projects": [{"id": "acme/apps/web"}]}})
}

async fn configure(app: &TestApp, config: Value) {
    let res = app
        .internal(
            Method::POST,
            "/api/v4/internal/kubernetes/agent_configuration",
            &json!({"agent_id": AGENT, "agent_config": config}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// envlens with agent 7 reached through a kubeconfig context, the environments deployed.
async fn kubeconfig_app(
    dir: &std::path::Path,
) -> (KubeApi, crate::support::kube_api::Served, TestApp) {
    let api = KubeApi::new();
    environment::environment(&api);
    let served = api.serve(dir).await;
    let app = TestApp::with_config(&format!(
        "kubernetes:\n  response_timeout: 5s\n{}",
        served.connections(&["7"])
    ))
    .await;
    environment::seed(&app).await;
    configure(&app, agent_config("user")).await;
    (api, served, app)
}

/// The text of the element whose opening tag has `id="<id>"`, to its first `</dd>`, `</ul>`
/// or `</p>` after it (whichever ends that element).
fn part<'a>(html: &'a str, id: &str, end: &str) -> &'a str {
    let start = html
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in {html}"));
    let stop = start + html[start..].find(end).expect("the element's end");
    &html[start..stop]
}

/// A page without its session's CSRF token (each session has its own).
fn without_csrf(html: &str) -> String {
    let Some(start) = html.find(r#"<meta name="csrf-token" content=""#) else {
        return html.to_owned();
    };
    let end = start + html[start..].find('>').unwrap();
    format!("{}{}", &html[..start], &html[end + 1..])
}

/// A deployment of the agent's own project (private: dev may not read it), through agent 7.
async fn deploy_elsewhere(app: &TestApp) {
    let res = app.internal(Method::POST, "/api/v4/internal/deployments", &json!({
        "deployment": {"id": 90, "iid": 1, "status": "created", "ref": "main", "sha": "fff", "tag": false,
                       "created_at": "2026-11-21T10:00:00Z"},
        "project": {"id": 10, "full_path": "acme/agents"},
        "environment": {"id": 700, "name": "hidden-prod", "slug": "hidden-prod", "tier": "production"},
        "job": {"id": 90, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": "acme/agents:prod", "namespace": "secret-ns"}
    })).await;
    assert_eq!(res.status, 201, "{}", res.text());
    let hook = json!({"object_kind": "deployment", "deployment_id": 90, "status": "success",
        "status_changed_at": "2026-11-21 10:05:00 UTC", "environment": "hidden-prod",
        "project": {"id": 10, "path_with_namespace": "acme/agents"}});
    let res = app.hook("Deployment Hook", hook.to_string(), None).await;
    assert_eq!(res.status, 200, "{}", res.text());
}

/// Who may read the agent (an admin; a Developer its `ci_access` or `user_access` serves)
/// sees its page; a Reporter of the same project gets the very answer of a missing agent.
#[tokio::test]
async fn only_those_who_may_read_the_agent_see_its_page() {
    let dir = tempfile::tempdir().unwrap();
    let (_api, _served, app) = kubeconfig_app(dir.path()).await;
    for user in [ROOT, DEV] {
        let res = app.page_response_as(user, PAGE).await;
        assert_eq!(res.status, 200, "user {user}: {}", res.text());
        assert!(res.text().contains("<h1>Agent prod</h1>"), "{}", res.text());
    }
    // The project's path is matched as GitLab does, whatever its case.
    let res = app
        .page_response_as(DEV, "/agents?project=ACME/Agents&name=prod")
        .await;
    assert_eq!(res.status, 200, "{}", res.text());

    let refused = app.page_response_as(REP, PAGE).await;
    assert_eq!(refused.status, 404, "{}", refused.text());
    let refused = without_csrf(&refused.text());
    assert!(!refused.contains("prod"), "{refused}");
    for missing in [
        "/agents?project=acme/agents&name=nope",
        "/agents?project=acme/nothing&name=prod",
    ] {
        let res = app.page_response_as(REP, missing).await;
        assert_eq!(res.status, 404);
        assert_eq!(
            without_csrf(&res.text()),
            refused,
            "the same answer as {missing}"
        );
    }
    // Bad input is a 400 page, never a 5xx.
    for bad in [
        "/agents?project=acme/agents",
        "/agents?name=prod",
        "/agents?project=acme/agents&name=",
    ] {
        let res = app.page_response_as(DEV, bad).await;
        assert_eq!(res.status, 400, "{bad}: {}", res.text());
    }
    let long = format!("/agents?project=acme/agents&name={}", "x".repeat(2000));
    assert_eq!(app.page_response_as(DEV, &long).await.status, 400);
    // Without a session, the page leads to signing in.
    let res = app
        .send(
            Request::get(PAGE)
                .header(header::ACCEPT, "text/html")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 303);
}

/// Through a kubeconfig: the connection (kind, status in words, checked at), `access_as`,
/// the groups and projects its sections name that the viewer sees, and the environments it
/// serves that the viewer may read, each linked; the environment and group pages link to it.
#[tokio::test]
async fn the_agent_page_through_a_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let (_api, _served, app) = kubeconfig_app(dir.path()).await;
    deploy_elsewhere(&app).await;

    let html = app.page_as(DEV, PAGE).await;
    let connection = part(&html, "agent-connection", "</dd>");
    assert!(connection.contains("Kubeconfig"), "{connection}");
    assert!(connection.contains(">Not checked yet<"), "{connection}");
    // The status now is marked among the meanings.
    assert!(
        html.contains(r#"<div class="current" aria-current="true"><dt><span class="badge h-none">Not checked</span> (now)</dt><dd>envlens has not asked this cluster"#),
        "{html}"
    );
    let access_as = part(&html, "access-as", "</dd>");
    assert!(access_as.contains(">user<"), "{access_as}");
    assert!(access_as.contains("gitlab:user:"), "{access_as}");
    let user_access = part(&html, "user-access", "</section>");
    assert!(user_access.contains("acme/apps/web"), "{user_access}");
    let ci_access = part(&html, "ci-access", "</section>");
    assert!(
        ci_access.contains(r#"<a class="mono" href="/groups/acme/apps">acme/apps</a>"#),
        "{ci_access}"
    );
    // A project dev may not read is not listed; an administrator sees it.
    assert!(!ci_access.contains("acme/agents"), "{ci_access}");
    let admin = app.page_as(ROOT, PAGE).await;
    assert!(part(&admin, "ci-access", "</section>").contains("acme/agents"));

    // The environments whose last successful deployment went through it: production and
    // review (canary's failed), with their namespace and last deployment, linked.
    let envs = part(&html, "agent-environments", "</table>");
    assert!(
        envs.contains(
            r#"href="/environments?project=acme/apps/web&amp;name=production">production</a>"#
        ),
        "{envs}"
    );
    assert!(envs.contains(">review</a>"), "{envs}");
    assert!(!envs.contains("canary"), "{envs}");
    assert!(envs.contains(r#"<span class="mono">shop</span>"#), "{envs}");
    assert!(
        envs.contains(r#"href="/deployments?project=acme/apps/web&amp;iid=1">#1</a>"#),
        "{envs}"
    );
    // An environment of a project dev may not read is not; an administrator sees it.
    assert!(!envs.contains("hidden-prod"), "{envs}");
    assert!(part(&admin, "agent-environments", "</table>").contains("hidden-prod"));

    // Its environment's page and its group's page lead to it.
    let link = r#"href="/agents?project=acme/agents&amp;name=prod">prod</a>"#;
    let env_page = app
        .page_as(
            DEV,
            &format!("/environments?project=acme/apps/web&name={SLUG}"),
        )
        .await;
    assert!(env_page.contains(link), "{env_page}");
    let group_page = app.page_as(DEV, "/groups/acme/apps").await;
    assert!(group_page.contains(link), "{group_page}");

    // The environment page asked the cluster: connected, and when.
    let html = app.page_as(DEV, PAGE).await;
    let connection = part(&html, "agent-connection", "</dd>");
    assert!(connection.contains(">Connected<"), "{connection}");
    assert!(
        connection.contains("checked <time datetime=\"20"),
        "{connection}"
    );
}

/// Through GitLab's agent server: the kind, `access_as: agent`, and a disconnected agent's
/// status with KAS' message and what it means.
#[tokio::test]
async fn the_agent_page_through_kas() {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment::environment(&api);
    let served = api.serve(dir.path()).await;
    let ThroughKas {
        gitlab, kas, yaml, ..
    } = through_kas(&served, &[(AGENT, 10)], dir.path()).await;
    gitlab.kas.set_proxy_url(&kas.proxy_url());
    let app = TestApp::with_config(&format!("kubernetes:\n  response_timeout: 5s\n{yaml}")).await;
    environment::seed(&app).await;
    configure(&app, agent_config("agent")).await;

    app.page_as(
        DEV,
        &format!("/environments?project=acme/apps/web&name={SLUG}"),
    )
    .await;
    let html = app.page_as(DEV, PAGE).await;
    let connection = part(&html, "agent-connection", "</dd>");
    assert!(
        connection.contains("GitLab&#39;s agent server")
            || connection.contains("GitLab's agent server"),
        "{connection}"
    );
    assert!(connection.contains(">Connected<"), "{connection}");
    let access_as = part(&html, "access-as", "</dd>");
    assert!(access_as.contains(">agent<"), "{access_as}");
    assert!(access_as.contains("service account"), "{access_as}");

    // agentk goes away; a namespace never viewed asks the cluster and finds it away.
    kas.disconnect(AGENT);
    environment::deploy_through(
        &app,
        9,
        (103, "elsewhere"),
        "success",
        ("acme/agents:prod", "other-ns"),
    )
    .await;
    app.page_as(DEV, "/environments?project=acme/apps/web&name=elsewhere")
        .await;
    let html = app.page_as(DEV, PAGE).await;
    let connection = part(&html, "agent-connection", "</dd>");
    assert!(connection.contains(">Agent not connected<"), "{connection}");
    assert!(
        connection.contains("Agent connection not found"),
        "{connection}"
    );
    assert!(
        html.contains(r#"<div class="current" aria-current="true"><dt><span class="badge h-degraded">Agent not connected</span> (now)</dt><dd>agentk is not connected to GitLab"#),
        "{html}"
    );
    let envs = part(&html, "agent-environments", "</table>");
    assert!(
        envs.contains(r#"<span class="mono">other-ns</span>"#),
        "{envs}"
    );
}

/// The page in Chromium at a phone's and a desktop's width, light and dark (screenshots in
/// `target/browser/agent-*.png`), and its connection followed without a reload: the cluster
/// goes away and the page says so by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_page_fits_a_phone_and_a_desktop_and_follows_its_connection() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let demo = Demo::start().await;
    let page = browser.page().await;
    demo.sign_in(&page).await;
    let path = "/agents?project=acme/platform/agents&name=production";
    for width in [390, 1440] {
        for dark in [false, true] {
            page.screen(width, dark).await;
            page.goto(&format!("{}{path}", demo.url)).await;
            let scheme = if dark { "dark" } else { "light" };
            let name = format!("agent-{width}-{scheme}");
            let r = page
                .wait_for(
                    "!!document.getElementById('agent-connection')",
                    Duration::from_secs(20),
                )
                .await;
            check(&page, &name, r).await;
            let shot = shots().join(format!("{name}.png"));
            page.screenshot(&shot).await;
            page.screenshot_screen(&shot.with_extension("screen.png"))
                .await;
            let r = page
                .wait_for(
                    "document.documentElement.scrollWidth <= window.innerWidth + 1",
                    Duration::from_secs(2),
                )
                .await;
            check(&page, &format!("{name}-width"), r).await;
            check_contrast(&page, &name).await;
        }
    }
    let text = page.text().await;
    assert!(text.contains("Kubeconfig"), "{text}");
    assert!(text.contains("acme/platform/shop"), "{text}");

    // The seed's snapshots asked the cluster: connected. Then it goes away.
    page.screen(1440, false).await;
    page.goto(&format!("{}{path}", demo.url)).await;
    let r = page
        .wait_for(
            "document.getElementById('agent-connection').innerText.includes('Connected')",
            Duration::from_secs(20),
        )
        .await;
    check(&page, "agent-connected", r).await;
    page.eval("window.notReloaded = true").await;
    demo.cluster_relay.refuse(true);
    let r = page
        .wait_for(
            "window.notReloaded === true && document.getElementById('agent-connection').innerText.includes('Unreachable')",
            Duration::from_secs(90),
        )
        .await;
    check(&page, "agent-unreachable", r).await;
    page.screenshot(&shots().join("agent-unreachable-1440-light.png"))
        .await;
}
