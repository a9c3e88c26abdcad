//! Clusters reached through GitLab's agent server (SPEC 14): an agent with no
//! `kubernetes.agents` entry is reached through the KAS-shaped proxy (`support::kas`) as itself,
//! its address found in GitLab's metadata (17.6's and 17.5's shapes) and found again when KAS
//! moves; KAS' refusal of envlens' token and a disconnected agent are 503s naming the agent,
//! never the viewer's own 401.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Method, Request};
use envlens::auth::mint_session;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tempfile::TempDir;
use tower::ServiceExt;

use crate::support::environment::{self, NS, SLUG};
use crate::support::gitlab::TestGitLab;
use crate::support::kas::{through_kas, TestKas, ThroughKas};
use crate::support::kube_api::{KubeApi, Served};
use crate::support::*;

const KAS_TOKEN: &str = crate::support::kas::ENVLENS_TOKEN;
const DEV: (i64, &str) = (2, "dev");
const AGENT: i64 = 7;
use crate::support::kas::AGENT_SERVICE_ACCOUNT as SERVICE_ACCOUNT;

/// A cluster with the environment, GitLab, KAS (waiting `wait` for a disconnected agent) with
/// agent 7's agentk connected, and envlens configured with only `gitlab.url` and a KAS token
/// file: agent 7 has no entry.
struct World {
    api: KubeApi,
    served: Served,
    gitlab: TestGitLab,
    kas: TestKas,
    app: TestApp,
    dir: TempDir,
}

async fn world(metadata: impl FnOnce(&TestGitLab, &TestKas)) -> World {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment::environment(&api);
    let served = api.serve(dir.path()).await;
    let ThroughKas {
        gitlab, kas, yaml, ..
    } = through_kas(&served, &[(AGENT, 10)], dir.path()).await;
    metadata(&gitlab, &kas);
    let app = envlens_app(&yaml).await;
    World {
        api,
        served,
        gitlab,
        kas,
        app,
        dir,
    }
}

/// envlens with GitLab and KAS (`yaml`), agent 7 with `access_as: agent`, and the
/// environment's deployments recorded.
async fn envlens_app(yaml: &str) -> TestApp {
    let app = TestApp::with_config(&format!("kubernetes:\n  response_timeout: 5s\n{yaml}")).await;
    environment::seed(&app).await;
    // The agent's identity, not the viewer's: what GitLab's frontend shows through KAS.
    let config = json!({"ci_access": {"groups": [{"id": "acme/apps"}]},
        "user_access": {"access_as": {"agent": {}}, "projects": [{"id": "acme/apps/web"}]}});
    let res = app
        .internal(
            Method::POST,
            "/api/v4/internal/kubernetes/agent_configuration",
            &json!({"agent_id": AGENT, "agent_config": config}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    app
}

const GROUP_FIELDS: &str =
    "namespace health resources { kind name } warnings errors { apiVersion kind code message }";

async fn view(app: &TestApp, environment: &str) -> Value {
    let query = format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{environment}") {{
            resourceGroup {{ {GROUP_FIELDS} }} }} }} }}"#
    );
    let body = app.graphql(DEV, &query).await;
    assert!(body.get("errors").is_none(), "{body}");
    body["data"]["project"]["environment"]["resourceGroup"].clone()
}

/// Agent 7's `connection`, read by an administrator.
async fn connection(app: &TestApp) -> Value {
    let query = r#"{ project(fullPath: "acme/agents") { clusterAgent(name: "prod") {
        connection { kind status message checkedAt } } } }"#;
    let body = app.graphql((1, "root"), query).await;
    assert!(body.get("errors").is_none(), "{body}");
    body["data"]["project"]["clusterAgent"]["connection"].clone()
}

fn names(group: &Value) -> Vec<String> {
    let mut names: Vec<String> = group["resources"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|r| {
            format!(
                "{}/{}",
                r["kind"].as_str().unwrap(),
                r["name"].as_str().unwrap()
            )
        })
        .collect();
    names.sort();
    names
}

fn proxy_request(path: &str) -> Request<Body> {
    let (token, _) = mint_session(SESSION_KEY, DEV.0, DEV.1, Duration::from_secs(600)).unwrap();
    Request::get(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header("Gitlab-Agent-Id", AGENT.to_string())
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn an_agent_without_an_entry_is_reached_through_kas_as_itself() {
    let w = world(|gitlab, kas| gitlab.kas.set_proxy_url(&kas.proxy_url())).await;
    let group = view(&w.app, SLUG).await;
    assert_eq!(group["errors"], json!([]), "{group}");
    let names = names(&group);
    assert!(names.contains(&"Deployment/web".to_owned()), "{names:?}");
    assert!(names.contains(&"Service/web".to_owned()), "{names:?}");

    // KAS got the agent's credential and nothing else of the viewer's.
    let received = w.kas.received();
    assert!(!received.is_empty());
    for (_, path, headers) in &received {
        assert!(path.starts_with("/k8s-proxy/"), "{path}");
        let auth: Vec<_> = headers.get_all(header::AUTHORIZATION).iter().collect();
        assert_eq!(auth, [&format!("Bearer pat:{AGENT}:{KAS_TOKEN}")], "{path}");
    }
    // The cluster saw the agent's ServiceAccount and never the token.
    let requests = w.api.requests();
    assert!(requests
        .iter()
        .any(|r| r.path == format!("/apis/apps/v1/namespaces/{NS}/deployments")));
    for r in &requests {
        assert_eq!(r.header("authorization"), None, "{}", r.path);
        if r.path.starts_with("/api/v1/namespaces") || r.path.starts_with("/apis/apps") {
            assert_eq!(
                r.impersonate_user.as_deref(),
                Some(SERVICE_ACCOUNT),
                "{}",
                r.path
            );
        }
    }
    // GitLab was asked once for the agent and token: KAS keeps its answer.
    let asked = w.gitlab.kas.authorizations.lock().unwrap().clone();
    assert_eq!(asked, [(AGENT, KAS_TOKEN.to_owned())]);
}

#[tokio::test]
async fn gitlab_17_5_metadata_leads_to_the_proxy_through_external_url() {
    let w = world(|gitlab, kas| gitlab.kas.set_external_url_only(&kas.external_url())).await;
    let group = view(&w.app, SLUG).await;
    assert_eq!(group["errors"], json!([]), "{group}");
    assert!(
        names(&group).contains(&"Deployment/web".to_owned()),
        "{group}"
    );
    assert!(!w.kas.received().is_empty());
}

#[tokio::test]
async fn the_proxy_lists_and_watches_through_kas() {
    let w = world(|gitlab, kas| gitlab.kas.set_proxy_url(&kas.proxy_url())).await;
    let res = w
        .app
        .send(proxy_request(&format!(
            "/k8s-proxy/api/v1/namespaces/{NS}/pods"
        )))
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let pods: Vec<String> = res.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(!pods.is_empty());
    assert_eq!(
        pods,
        w.api
            .list("pods", Some(NS))
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    );

    // A watch streams through envlens and KAS: an event written after it started arrives.
    let rv = w.api.resource_version();
    let response = w
        .app
        .router
        .clone()
        .oneshot(proxy_request(&format!(
            "/k8s-proxy/api/v1/namespaces/{NS}/pods?watch=true&resourceVersion={rv}"
        )))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    w.api.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "late", "namespace": NS},
        "spec": {"containers": [{"name": "app", "image": "nginx"}]}}));
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.contains("\"late\"") {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = tokio::time::timeout(left, body.frame())
            .await
            .expect("the event within 10 s")
            .expect("the stream open")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    assert!(seen.contains("ADDED"), "{seen}");
}

#[tokio::test]
async fn a_token_kas_refuses_is_not_the_viewers_401() {
    let w = world(|gitlab, kas| gitlab.kas.set_proxy_url(&kas.proxy_url())).await;
    // The token was revoked at GitLab.
    w.gitlab.kas.revoke(KAS_TOKEN);
    let res = w
        .app
        .send(proxy_request(&format!(
            "/k8s-proxy/api/v1/namespaces/{NS}/pods"
        )))
        .await;
    assert_eq!(res.status, 503, "{}", res.text());
    assert!(res.headers.get("gitlab-unauthorized").is_none());
    let status = res.json();
    assert_eq!(status["kind"], "Status");
    let message = status["message"].as_str().unwrap();
    assert!(message.contains(&format!("agent {AGENT}")), "{message}");
    assert!(
        message.contains("token refused by GitLab's agent server"),
        "{message}"
    );
    // KAS did refuse it, with its own 401.
    assert!(!w.kas.received().is_empty());
    // The circuit is open: the same answer at once, KAS not asked again before its probe.
    let asked = w.kas.received().len();
    let again = w
        .app
        .send(proxy_request(&format!(
            "/k8s-proxy/api/v1/namespaces/{NS}/pods"
        )))
        .await;
    assert_eq!(again.status, 503, "{}", again.text());
    assert_eq!(again.json()["message"], status["message"]);
    assert_eq!(w.kas.received().len(), asked);

    let seen = connection(&w.app).await;
    assert_eq!(
        (&seen["kind"], &seen["status"]),
        (&json!("KAS"), &json!("TOKEN_REFUSED")),
        "{seen}"
    );
    assert!(
        seen["message"].as_str().unwrap().contains("k8s_proxy"),
        "{seen}"
    );

    // A view says the same, as one error of code 503, not a 401.
    let group = view(&w.app, SLUG).await;
    let errors = group["errors"].as_array().unwrap();
    assert!(!errors.is_empty(), "{group}");
    for e in errors {
        assert_eq!(e["code"], 503, "{group}");
        assert!(
            e["message"].as_str().unwrap().contains("token refused"),
            "{group}"
        );
    }
}

#[tokio::test]
async fn a_disconnected_agent_answers_503_per_kind() {
    let w = world(|gitlab, kas| gitlab.kas.set_proxy_url(&kas.proxy_url())).await;
    let seen = connection(&w.app).await;
    assert_eq!(
        seen,
        json!({"kind": "KAS", "status": "NOT_CHECKED", "message": null, "checkedAt": null})
    );
    // Connected for a first view of production (discovery is known from then on).
    assert_eq!(view(&w.app, SLUG).await["errors"], json!([]));
    let seen = connection(&w.app).await;
    assert_eq!(
        (&seen["status"], &seen["message"]),
        (&json!("CONNECTED"), &Value::Null),
        "{seen}"
    );
    assert!(seen["checkedAt"].is_string(), "{seen}");
    w.kas.disconnect(AGENT);
    // A namespace never viewed: each kind's list waits for the agent, then fails.
    deploy_to(&w.app, 9, (103, "elsewhere"), "other-ns").await;
    let started = Instant::now();
    let group = view(&w.app, "elsewhere").await;
    let errors = group["errors"].as_array().unwrap();
    assert!(errors.len() > 1, "{group}");
    for e in errors {
        assert_eq!(e["code"], 503, "{group}");
        assert_ne!(e["kind"], "", "{group}");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("agent {AGENT} is not connected")),
            "{message}"
        );
        assert!(message.contains("Agent connection not found"), "{message}");
    }
    // Not 20 s per kind: the lists wait side by side, as long as KAS does.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );

    // A first view of a disconnected agent (nothing discovered yet): one 503 entry.
    let w2 = world(|gitlab, kas| gitlab.kas.set_proxy_url(&kas.proxy_url())).await;
    w2.kas.disconnect(AGENT);
    let group = view(&w2.app, SLUG).await;
    let errors = group["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{group}");
    assert_eq!(errors[0]["code"], 503);
    assert!(
        errors[0]["message"]
            .as_str()
            .unwrap()
            .contains("not connected"),
        "{group}"
    );
}

#[tokio::test]
async fn kas_moving_is_found_in_the_metadata_again() {
    let w = world(|gitlab, kas| gitlab.kas.set_proxy_url(&kas.proxy_url())).await;
    assert_eq!(view(&w.app, SLUG).await["errors"], json!([]));
    let reads = w
        .gitlab
        .kas
        .metadata_reads
        .load(std::sync::atomic::Ordering::SeqCst);
    // KAS moves: a new one, the metadata names it, the old one goes away.
    let moved = TestKas::start(&w.gitlab.url, Duration::from_secs(1)).await;
    moved.connect(AGENT, &w.served);
    w.gitlab.kas.set_proxy_url(&moved.proxy_url());
    drop(w.kas);
    // The first request fails (nobody at the old address), which has the metadata read again
    // (at most once per metadata_interval, 1 s here); views then go to the new address.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let res = w
            .app
            .send(proxy_request(&format!(
                "/k8s-proxy/api/v1/namespaces/{NS}/pods"
            )))
            .await;
        if res.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {}: {}",
            res.status,
            res.text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!moved.received().is_empty());
    assert!(
        w.gitlab
            .kas
            .metadata_reads
            .load(std::sync::atomic::Ordering::SeqCst)
            > reads
    );
    let _ = (&w.dir, &w.api);
}

/// A successful deployment of acme/apps/web to environment `env` in `namespace`.
async fn deploy_to(app: &TestApp, id: i64, env: (i64, &str), namespace: &str) {
    environment::deploy_through(app, id, env, "success", ("acme/agents:prod", namespace)).await;
}

#[tokio::test]
async fn an_agent_with_neither_entry_nor_kas_has_no_connection() {
    let app = TestApp::with_config("kubernetes:\n  response_timeout: 5s\n").await;
    environment::seed(&app).await;
    let seen = connection(&app).await;
    assert_eq!(
        seen,
        json!({"kind": "NONE", "status": "NOT_CONFIGURED",
               "message": format!("No cluster connection is configured for agent {AGENT}"),
               "checkedAt": null})
    );
}

const KAS_CONNECTED: &str = r#"envlens_agent_connections{kind="kas",status="connected"}"#;
const KAS_AWAY: &str = r#"envlens_agent_connections{kind="kas",status="agent_not_connected"}"#;
const CHANGES_TO_AWAY: &str =
    r#"envlens_agent_status_changes_total{kind="kas",status="agent_not_connected"}"#;
const CHANGES_TO_CONNECTED: &str =
    r#"envlens_agent_status_changes_total{kind="kas",status="connected"}"#;

/// GETs of `path` that are lists (not watches).
fn lists_of(api: &KubeApi, path: &str) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == path && !r.query.contains("watch=true"))
        .count()
}

/// SPEC 14's circuit: once KAS has said the agent is not connected (after its wait, 5 s here),
/// the agent's views answer at once without asking KAS, still listing what the cache holds
/// (per-kind 503s, a warning with since when, health UNKNOWN); the agent coming back closes it
/// after the next probe, and the watches resume from their versions rather than list again.
/// `/metrics` counts the agents by kind and status, and the changes.
#[tokio::test]
async fn a_disconnected_agents_circuit_answers_at_once_until_the_agent_is_back() {
    let w = world(|gitlab, kas| gitlab.kas.set_proxy_url(&kas.proxy_url())).await;
    w.kas.set_wait(Duration::from_secs(5));
    let fresh = view(&w.app, SLUG).await;
    assert_eq!(fresh["errors"], json!([]), "{fresh}");
    let deployments = format!("/apis/apps/v1/namespaces/{NS}/deployments");
    let listed = lists_of(&w.api, &deployments);
    assert_eq!(listed, 1);
    // Counted by kind and status, never by agent.
    assert_eq!(w.app.metric(KAS_CONNECTED).await, 1.0);
    assert_eq!(w.app.metric(CHANGES_TO_CONNECTED).await, 1.0);
    assert_eq!(w.app.metric(CHANGES_TO_AWAY).await, 0.0);

    w.kas.disconnect(AGENT);
    deploy_to(&w.app, 9, (103, "elsewhere"), "other-ns").await;
    deploy_to(&w.app, 10, (104, "third"), "third-ns").await;
    // The first failure waits for KAS, then opens the circuit.
    let group = view(&w.app, "elsewhere").await;
    let errors = group["errors"].as_array().unwrap();
    assert!(!errors.is_empty(), "{group}");
    assert_eq!(connection(&w.app).await["status"], "AGENT_NOT_CONNECTED");
    // The production watches broke off with the tunnel; their resumptions fail too (some first
    // with the cut connection's own error, then as the circuit says).
    let deadline = Instant::now() + Duration::from_secs(30);
    let all_503 = |group: &Value| {
        let errors = group["errors"].as_array().unwrap();
        !errors.is_empty() && errors.iter().all(|e| e["code"] == 503)
    };
    while !all_503(&view(&w.app, SLUG).await) {
        assert!(Instant::now() < deadline, "the watches never failed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // While open: at once, and KAS is not asked (but for at most the circuit's single probe).
    let asked = w.kas.received().len();
    let started = Instant::now();
    let again = view(&w.app, "elsewhere").await;
    let never_viewed = view(&w.app, "third").await;
    let cached = view(&w.app, SLUG).await;
    let proxied = w
        .app
        .send(proxy_request(&format!(
            "/k8s-proxy/api/v1/namespaces/{NS}/pods"
        )))
        .await;
    let took = started.elapsed();
    assert_eq!(proxied.status, 503, "{}", proxied.text());
    assert!(
        proxied.json()["message"]
            .as_str()
            .unwrap()
            .contains(&format!("agent {AGENT} is not connected")),
        "{}",
        proxied.text()
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(w.kas.received().len() <= asked + 1, "KAS was asked");
    // The probes due meanwhile (1 s after the opening, then 2 s after that one came back) are
    // envlens' own `GET /version`: no viewer's request is one, so none waits for KAS.
    let probes = |kas: &TestKas| {
        kas.received()
            .iter()
            .filter(|(method, path, _)| method == "GET" && path.ends_with("/version"))
            .count()
    };
    // One may be out already (the cache's own retries find it due too), waiting KAS' 5 s:
    // callers are answered at once until the next one goes.
    let probed = probes(&w.kas);
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until && probes(&w.kas) == probed {
        let started = Instant::now();
        let proxied = w
            .app
            .send(proxy_request(&format!(
                "/k8s-proxy/api/v1/namespaces/{NS}/pods"
            )))
            .await;
        assert_eq!(proxied.status, 503, "{}", proxied.text());
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "a caller waited {took:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(probes(&w.kas) > probed, "no probe was sent");
    for group in [&again, &never_viewed, &cached] {
        let errors = group["errors"].as_array().unwrap();
        assert!(!errors.is_empty(), "{group}");
        for e in errors {
            assert_eq!(e["code"], 503, "{group}");
            let message = e["message"].as_str().unwrap();
            assert!(
                message.contains(&format!("agent {AGENT} is not connected")),
                "{message}"
            );
        }
        assert_eq!(group["health"], "UNKNOWN", "{group}");
        assert!(
            group["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w.as_str().unwrap().contains("not been reachable since 20")),
            "{group}"
        );
    }
    // What the cache holds is still listed.
    assert_eq!(names(&cached), names(&fresh));
    assert_eq!(w.app.metric(KAS_CONNECTED).await, 0.0);
    assert_eq!(w.app.metric(KAS_AWAY).await, 1.0);
    assert!(w.app.metric(CHANGES_TO_AWAY).await >= 1.0);
    let text = w
        .app
        .send(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .text();
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("envlens_agent_") && l.contains(&format!("\"{AGENT}\""))),
        "{text}"
    );

    // Back: the next probe closes the circuit, the watches resume, the view is fresh again.
    w.kas.connect(AGENT, &w.served);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let group = view(&w.app, SLUG).await;
        if group["errors"] == json!([]) && group["health"] == fresh["health"] {
            assert_eq!(names(&group), names(&fresh));
            assert!(
                !group["warnings"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|w| w.as_str().unwrap().contains("not been reachable")),
                "{group}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "still away: {group}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(connection(&w.app).await["status"], "CONNECTED");
    assert_eq!(w.app.metric(KAS_CONNECTED).await, 1.0);
    assert_eq!(w.app.metric(KAS_AWAY).await, 0.0);
    assert!(w.app.metric(CHANGES_TO_CONNECTED).await >= 2.0);
    // Resumed from their versions: the production Deployments were not listed again.
    assert_eq!(lists_of(&w.api, &deployments), listed);
}

/// An agent away before its first view: the view gives up (on its own timeouts, shorter than
/// KAS' wait), but KAS' answer that comes after is still read, so the circuit opens and the
/// next views are answered at once rather than each waiting out its timeout.
#[tokio::test]
async fn an_agent_away_before_its_first_view_opens_its_circuit_all_the_same() {
    let w = world(|gitlab, kas| gitlab.kas.set_proxy_url(&kas.proxy_url())).await;
    // Longer than the response timeout (5 s) and than discovery's (10 s).
    w.kas.set_wait(Duration::from_secs(12));
    w.kas.disconnect(AGENT);
    // Discovery gives up first: the view is a GraphQL error.
    let query = format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "{SLUG}") {{
            resourceGroup {{ {GROUP_FIELDS} }} }} }} }}"#
    );
    let first = w.app.graphql(DEV, &query).await;
    assert!(
        first["errors"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no answer within")),
        "{first}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while connection(&w.app).await["status"] != "AGENT_NOT_CONNECTED" {
        assert!(
            Instant::now() < deadline,
            "the circuit never opened: {}",
            connection(&w.app).await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let started = Instant::now();
    let group = view(&w.app, SLUG).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}");
    let errors = group["errors"].as_array().unwrap();
    assert!(!errors.is_empty(), "{group}");
    for e in errors {
        assert_eq!(e["code"], 503, "{group}");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("agent {AGENT} is not connected")),
            "{message}"
        );
    }
}

/// The environment page says how the agent's cluster is reached and how its last request went,
/// in words, rendered on the server (SPEC 9, 14).
#[tokio::test]
async fn the_environment_page_shows_the_agents_connection() {
    let w = world(|gitlab, kas| gitlab.kas.set_proxy_url(&kas.proxy_url())).await;
    let page = format!("/environments?project=acme/apps/web&name={SLUG}");
    let connection_of = |html: &str| -> String {
        let start = html
            .find(r#"id="agent-connection""#)
            .expect("the connection");
        let end = start + html[start..].find("</dd>").unwrap();
        html[start..end].to_owned()
    };
    // Viewed once, so asked once.
    w.app.page_as(DEV.0, &page).await;
    let html = w.app.page_as(DEV.0, &page).await;
    let shown = connection_of(&html);
    assert!(
        shown.contains("GitLab&#39;s agent server") || shown.contains("GitLab's agent server"),
        "{shown}"
    );
    assert!(shown.contains(">Connected<"), "{shown}");
    assert!(shown.contains("checked <time datetime=\"20"), "{shown}");

    w.kas.disconnect(AGENT);
    deploy_to(&w.app, 9, (103, "elsewhere"), "other-ns").await;
    // A namespace never viewed asks the cluster, and finds the agent away.
    w.app
        .page_as(DEV.0, "/environments?project=acme/apps/web&name=elsewhere")
        .await;
    let html = w.app.page_as(DEV.0, &page).await;
    let shown = connection_of(&html);
    assert!(shown.contains(">Agent not connected<"), "{shown}");
    assert!(shown.contains("Agent connection not found"), "{shown}");
    // The group says since when what it shows is old, and that its health is unknown.
    assert!(html.contains("not been reachable since"), "{html}");
}
