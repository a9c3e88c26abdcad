//! GitLab's tokens taken only with GitLab's scopes (SPEC 13, "GitLab's tokens"), and what an
//! unknown token may cost GitLab: the requests an attacker would send with a `read_user`
//! token, another application's OAuth token, a `k8s_proxy` token on GraphQL, and thousands of
//! random tokens, against the test GitLab that counts its calls.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, Request};
use envlens::gitlab::api::{GitLab, Policy};
use envlens::gitlab::tokens::budget::{BURST, PER_MINUTE};
use envlens::gitlab::Instance;
use serde_json::json;

use crate::proxy::{cluster, config, populate, PODS};
use crate::support::gitlab::TestGitLab;
use crate::support::*;

/// envlens' own OAuth application ("Sign in with GitLab").
const OWN_APPLICATION: &str = "envlens-application-uid";

/// envlens beside the test GitLab and the proxy tests' cluster and mirror (user 2 `pdev` is a
/// Developer of acme/apps/web, which agent 7's `user_access` names).
async fn beside(gitlab: &TestGitLab, extra: &str) -> (TestApp, impl Sized) {
    let (cluster_api, served, dir) = cluster().await;
    let yaml = format!("{}{extra}", config(&served));
    let api = GitLab::new(&gitlab.url, None, Default::default(), Policy::default()).unwrap();
    let instance = Instance::new(
        api,
        "https://envlens.example.com",
        Duration::from_secs(60),
        Some(OWN_APPLICATION.into()),
    );
    let app = TestApp::with_config_then(&yaml, |state| state.with_gitlab(instance)).await;
    populate(&app).await;
    (app, (cluster_api, served, dir))
}

fn from(address: &str, request: axum::http::request::Builder) -> axum::http::request::Builder {
    let peer = SocketAddr::new(address.parse::<IpAddr>().unwrap(), 40_000);
    request.extension(ConnectInfo(peer))
}

fn graphql(token: &str) -> Request<Body> {
    from("192.0.2.10", Request::post("/api/graphql"))
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(
            json!({"query": "{ currentUser { username } }"}).to_string(),
        ))
        .unwrap()
}

fn proxied(token: &str) -> Request<Body> {
    from("192.0.2.10", Request::get(PODS))
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header("Gitlab-Agent-Id", "7")
        .body(Body::empty())
        .unwrap()
}

/// A 401 whose message names `scope`.
#[track_caller]
fn refused_naming(res: &TestResponse, scope: &str) {
    assert_eq!(res.status, 401, "{}", res.text());
    assert!(res.text().contains(&format!("`{scope}`")), "{}", res.text());
}

#[tokio::test]
async fn a_read_user_token_is_refused_on_graphql_and_the_proxy_naming_the_scope() {
    let gitlab = TestGitLab::start().await;
    let (app, _dir) = beside(&gitlab, "").await;
    gitlab.accept_access_token("glpat-read-user", 2, "pdev", &["read_user"]);
    refused_naming(&app.send(graphql("glpat-read-user")).await, "read_api");
    let res = app.send(proxied("glpat-read-user")).await;
    refused_naming(&res, "k8s_proxy");
    assert_eq!(res.json()["kind"], "Status");
    assert_eq!(res.headers["gitlab-unauthorized"], "true");
    // The same user's `api` token takes both.
    gitlab.accept_access_token("glpat-api", 2, "pdev", &["api"]);
    let res = app.send(graphql("glpat-api")).await;
    assert_eq!(
        res.json()["data"]["currentUser"]["username"],
        "pdev",
        "{}",
        res.text()
    );
    let res = app.send(proxied("glpat-api")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["kind"], "PodList");
}

#[tokio::test]
async fn a_k8s_proxy_token_takes_the_proxy_but_not_graphql() {
    let gitlab = TestGitLab::start().await;
    let (app, _dir) = beside(&gitlab, "").await;
    gitlab.accept_access_token("glpat-k8s", 2, "pdev", &["k8s_proxy"]);
    let res = app.send(proxied("glpat-k8s")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["items"].as_array().unwrap().len(), 2);
    refused_naming(&app.send(graphql("glpat-k8s")).await, "read_api");
    // A `read_api` token the other way round.
    gitlab.accept_access_token("glpat-read-api", 2, "pdev", &["read_api"]);
    assert_eq!(app.send(graphql("glpat-read-api")).await.status, 200);
    refused_naming(&app.send(proxied("glpat-read-api")).await, "k8s_proxy");
}

#[tokio::test]
async fn an_oauth_token_of_another_application_is_refused() {
    let gitlab = TestGitLab::start().await;
    let (app, _dir) = beside(&gitlab, "").await;
    // Issued to some other application the user authorized, with the scopes envlens' own asks.
    gitlab.accept_oauth_token(
        "oauth-other",
        2,
        "pdev",
        "another-app",
        &["openid", "read_user"],
    );
    let res = app.send(graphql("oauth-other")).await;
    refused_naming(&res, "read_api");
    assert!(res.text().contains("another application"), "{}", res.text());
    refused_naming(&app.send(proxied("oauth-other")).await, "k8s_proxy");
    // envlens' own application's token passes; another application's with `api` too.
    gitlab.accept_oauth_token(
        "oauth-own",
        2,
        "pdev",
        OWN_APPLICATION,
        &["openid", "read_user"],
    );
    assert_eq!(app.send(graphql("oauth-own")).await.status, 200);
    assert_eq!(app.send(proxied("oauth-own")).await.status, 200);
    gitlab.accept_oauth_token("oauth-api", 2, "pdev", "another-app", &["api"]);
    assert_eq!(app.send(graphql("oauth-api")).await.status, 200);
}

fn me(token: &str, peer: &str, forwarded_for: Option<&str>) -> Request<Body> {
    let mut request = from(peer, Request::get("/api/user"))
        .header(header::AUTHORIZATION, format!("Bearer {token}"));
    if let Some(client) = forwarded_for {
        request = request.header("x-forwarded-for", client);
    }
    request.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn random_tokens_cost_gitlab_only_what_the_rate_allows() {
    let gitlab = TestGitLab::start().await;
    let (app, _dir) = beside(&gitlab, "trusted_proxies: [127.0.0.1]\n").await;
    gitlab.accept_token("glpat-real", 2, "pdev");
    let started = Instant::now();
    let (mut refused, mut limited) = (0, 0);
    for _ in 0..5_000 {
        let token = format!("glpat-{:032x}", rand::random::<u128>());
        let res = app.send(me(&token, "198.51.100.7", None)).await;
        match res.status.as_u16() {
            401 => refused += 1,
            429 => {
                limited += 1;
                let wait: u64 = res.headers["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!((1..=60).contains(&wait), "{wait}");
            }
            other => panic!("{other}: {}", res.text()),
        }
    }
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let calls = gitlab.token_checks.load(Ordering::SeqCst);
    let allowed = BURST as f64 + PER_MINUTE as f64 * minutes + 1.0;
    assert!(calls as f64 <= allowed, "{calls} calls in {minutes:.2} min");
    assert_eq!(refused, calls, "each call a refusal, the rest limited");
    assert_eq!(refused + limited, 5_000);

    // Rotating X-Forwarded-For from the same (untrusted) peer buys nothing.
    let before = gitlab.token_checks.load(Ordering::SeqCst);
    for i in 0..20 {
        let res = app
            .send(me(
                "glpat-another",
                "198.51.100.7",
                Some(&format!("203.0.113.{i}")),
            ))
            .await;
        assert_eq!(res.status, 429, "{}", res.text());
    }
    assert_eq!(gitlab.token_checks.load(Ordering::SeqCst), before);

    // A real user elsewhere still gets in, directly or behind the trusted proxy.
    let res = app.send(me("glpat-real", "192.0.2.44", None)).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["username"], "pdev");
    gitlab.accept_token("glpat-real-2", 2, "pdev");
    let res = app
        .send(me("glpat-real-2", "127.0.0.1", Some("192.0.2.45")))
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
}

#[tokio::test]
async fn a_refused_token_costs_one_call_a_minute() {
    let gitlab = TestGitLab::start().await;
    let (app, _dir) = beside(&gitlab, "").await;
    for _ in 0..50 {
        let res = app.send(me("glpat-revoked", "192.0.2.50", None)).await;
        assert_eq!(res.status, 401, "{}", res.text());
    }
    assert_eq!(gitlab.token_checks.load(Ordering::SeqCst), 1);
    // GitLab down: a 503, never a pass, and nothing remembered.
    gitlab.failing.store(true, Ordering::SeqCst);
    gitlab.accept_token("glpat-new", 2, "pdev");
    let res = app.send(me("glpat-new", "192.0.2.50", None)).await;
    assert_eq!(res.error(503)["code"], "unavailable");
    gitlab.failing.store(false, Ordering::SeqCst);
    assert_eq!(
        app.send(me("glpat-new", "192.0.2.50", None)).await.status,
        200
    );
}
