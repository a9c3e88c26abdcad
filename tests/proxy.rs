//! The Kubernetes proxy (SPEC 5.3, section 6): `user_access` through every path, credentials,
//! impersonation exactly as KAS sends it, headers that must not leave, the cluster's answers and
//! streams passed through, unreachable clusters, and CORS. The cluster is the fake API server.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Method, Request};
use envlens::auth::mint_session;
use http_body_util::BodyExt;
use serde_json::json;
use tempfile::TempDir;
use tower::ServiceExt;

use crate::support::kube_api::{KubeApi, Served};
use crate::support::reach::{both_ways, Reach, Reached};
use crate::support::*;

/// acme (1) > acme/apps (2) > acme/apps/team (4); other (3).
/// Projects: acme/agents (10, the agents' configuration project), acme/apps/web (11).
/// Agent 7 `prod`: user_access as user, projects [acme/apps/web], groups [acme/apps].
/// Agent 8 `bare`: the same lists without access_as. Agent 9 `robot`: access_as agent.
/// Users: 1 root (admin); 2 pdev, developer of project 11; 3 gmaint, maintainer of acme;
/// 4 subonly, owner of acme/apps/team only; 5 rep, reporter of project 11; 6 gdev, developer
/// of acme/apps; 7 other, owner of other.
pub async fn setup(yaml: &str) -> TestApp {
    let app = TestApp::with_config(yaml).await;
    populate(&app).await;
    app
}

/// The identity and agents of [`setup`], recorded in `app`.
pub async fn populate(app: &TestApp) {
    let res = app.internal(Method::PUT, "/api/v4/internal/identity", &json!({
        "groups": [{"id": 1, "full_path": "acme"}, {"id": 2, "full_path": "acme/apps"},
                   {"id": 3, "full_path": "other"}, {"id": 4, "full_path": "acme/apps/team"}],
        "projects": [{"id": 10, "full_path": "acme/agents", "visibility": "private"},
                     {"id": 11, "full_path": "acme/apps/web", "visibility": "private"}],
        "users": [{"id": 1, "username": "root", "admin": true}, {"id": 2, "username": "pdev"},
                  {"id": 3, "username": "gmaint"}, {"id": 4, "username": "subonly"},
                  {"id": 5, "username": "rep"}, {"id": 6, "username": "gdev"}, {"id": 7, "username": "other"}],
        "members": [
            {"user_id": 2, "source_type": "project", "source_id": 11, "access_level": 30},
            {"user_id": 3, "source_type": "group", "source_id": 1, "access_level": 40},
            {"user_id": 4, "source_type": "group", "source_id": 4, "access_level": 50},
            {"user_id": 5, "source_type": "project", "source_id": 11, "access_level": 20},
            {"user_id": 6, "source_type": "group", "source_id": 2, "access_level": 30},
            {"user_id": 7, "source_type": "group", "source_id": 3, "access_level": 50}
        ]
    })).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let lists = json!({"projects": [{"id": "acme/apps/web"}], "groups": [{"id": "acme/apps"}]});
    for (id, name, access_as) in [
        (7, "prod", Some(json!({"user": {}}))),
        (8, "bare", None),
        (9, "robot", Some(json!({"agent": {}}))),
    ] {
        let res = app
            .internal(
                Method::PUT,
                &format!("/api/v4/internal/kubernetes/agents/{id}"),
                &json!({"project_id": 10, "name": name}),
            )
            .await;
        assert!(res.status.is_success(), "{}", res.text());
        let mut user_access = lists.clone();
        if let Some(access_as) = access_as {
            user_access["access_as"] = access_as;
        }
        let res = app
            .internal(
                Method::POST,
                "/api/v4/internal/kubernetes/agent_configuration",
                &json!({"agent_id": id, "agent_config": {"user_access": user_access}}),
            )
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
}

/// A fake cluster with two pods in `apps`, and envlens reaching it through `kubeconfig`.
pub async fn cluster() -> (KubeApi, Served, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    for name in ["web-1", "web-2"] {
        api.insert(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "apps", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "nginx"}]}}));
    }
    let served = api.serve(dir.path()).await;
    (api, served, dir)
}

pub fn config(served: &Served) -> String {
    format!(
        "kubernetes:\n{}  own_namespace: envlens\n",
        served.connections(&["7", "8", "acme/agents:robot"])
    )
}

pub fn token(user: i64) -> (String, String) {
    mint_session(SESSION_KEY, user, "ignored", Duration::from_secs(600)).unwrap()
}

pub fn bearer(user: i64, agent: i64, method: Method, path: &str) -> axum::http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {}", token(user).0))
        .header("Gitlab-Agent-Id", agent.to_string())
}

async fn get(app: &TestApp, user: i64, agent: i64, path: &str) -> TestResponse {
    app.send(
        bearer(user, agent, Method::GET, path)
            .body(Body::empty())
            .unwrap(),
    )
    .await
}

pub const PODS: &str = "/k8s-proxy/api/v1/namespaces/apps/pods";

#[track_caller]
fn assert_unauthorized(res: &TestResponse) {
    assert_eq!(res.status, 401, "{}", res.text());
    assert_eq!(res.headers["gitlab-unauthorized"], "true");
    let status = res.json();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["apiVersion"], "v1");
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "Unauthorized");
    assert_eq!(status["code"], 401);
}

fn roles(prefix: &str, id: i64, upto: &str) -> Vec<String> {
    let all = [
        "guest",
        "planner",
        "reporter",
        "developer",
        "maintainer",
        "owner",
    ];
    let n = all.iter().position(|r| *r == upto).unwrap() + 1;
    all[..n]
        .iter()
        .map(|r| format!("gitlab:{prefix}_role:{id}:{r}"))
        .collect()
}

#[tokio::test]
async fn user_access_through_every_path() {
    let (api, served, _dir) = cluster().await;
    let app = setup(&config(&served)).await;
    let user = |name: &str| format!("gitlab:user:{name}");

    // (user, expected project roles, expected group roles); None: refused.
    type Roles = Option<(Vec<String>, Vec<String>)>;
    let cases: [(i64, &str, Roles); 7] = [
        // Developer of the listed project; no access to the listed group.
        (2, "pdev", Some((roles("project", 11, "developer"), vec![]))),
        // Maintainer of an ancestor group: both the project (effective access) and the group.
        (
            3,
            "gmaint",
            Some((
                roles("project", 11, "maintainer"),
                roles("group", 2, "maintainer"),
            )),
        ),
        // Owner of a subgroup of the listed group only: no access through it.
        (4, "subonly", None),
        // Reporter: below developer.
        (5, "rep", None),
        // Developer of the listed group itself: the group, and the project inside it.
        (
            6,
            "gdev",
            Some((
                roles("project", 11, "developer"),
                roles("group", 2, "developer"),
            )),
        ),
        // Owner of an unrelated group.
        (7, "other", None),
        // Admin, a member of nothing: owner of everything listed.
        (
            1,
            "root",
            Some((roles("project", 11, "owner"), roles("group", 2, "owner"))),
        ),
    ];
    for (id, name, expected) in cases {
        api.clear_requests();
        let res = get(&app, id, 7, PODS).await;
        let Some((projects, groups)) = expected else {
            assert_unauthorized(&res);
            assert!(api.requests().is_empty(), "{name} reached the cluster");
            continue;
        };
        assert_eq!(res.status, 200, "{name}: {}", res.text());
        assert_eq!(res.json()["items"].as_array().unwrap().len(), 2);
        let sent = api.requests().pop().expect("the cluster was asked");
        assert_eq!(
            sent.impersonate_user.as_deref(),
            Some(&*user(name)),
            "{name}"
        );
        let mut expected_groups = vec!["gitlab:user".to_owned()];
        expected_groups.extend(projects);
        expected_groups.extend(groups);
        assert_eq!(sent.impersonate_groups, expected_groups, "{name}");
    }

    // No access_as: refused even to an admin and a qualifying member.
    for user in [1, 3] {
        assert_unauthorized(&get(&app, user, 8, PODS).await);
    }
    // access_as agent: the agent's own identity, no impersonation.
    api.clear_requests();
    let res = get(&app, 2, 9, PODS).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let sent = api.requests().pop().unwrap();
    assert_eq!(sent.impersonate_user, None);
    assert!(sent.impersonate_groups.is_empty());
    assert!(sent.impersonate_extra.is_empty());
    // ... and an unqualified user is still refused there.
    assert_unauthorized(&get(&app, 5, 9, PODS).await);
    // An agent that does not exist reads like a refusal.
    let unknown = get(&app, 2, 99, PODS).await;
    assert_unauthorized(&unknown);
    let refused = get(&app, 5, 7, PODS).await;
    assert_eq!(
        unknown.json()["message"]
            .as_str()
            .unwrap()
            .replace("99", "N"),
        refused.json()["message"]
            .as_str()
            .unwrap()
            .replace('7', "N")
    );
}

both_ways!(every_credential_failure_is_401);
async fn every_credential_failure_is_401(reach: Reach) {
    let world = streaming(reach).await;
    let (api, app) = (&world.api, &world.app);
    let (cookie_token, csrf) = token(2);
    let expired = sign(
        &json!({"iss": "gitlab", "aud": "envlens-user", "sub": "2", "username": "pdev", "csrf": "c",
                "iat": now() - 7200, "exp": now() - 3600}),
        SESSION_KEY,
        jsonwebtoken::Algorithm::HS256,
    );
    let other_key = sign(
        &json!({"iss": "gitlab", "aud": "envlens-user", "sub": "2", "username": "pdev", "csrf": "c",
                "iat": now(), "exp": now() + 600}),
        b"another-key-another-key-another-",
        jsonwebtoken::Algorithm::HS256,
    );
    let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("no credentials", vec![("gitlab-agent-id", "7".into())]),
        (
            "bad bearer",
            vec![
                ("authorization", "Bearer nonsense".into()),
                ("gitlab-agent-id", "7".into()),
            ],
        ),
        (
            "expired",
            vec![
                ("authorization", format!("Bearer {expired}")),
                ("gitlab-agent-id", "7".into()),
            ],
        ),
        (
            "signed with another key",
            vec![
                ("authorization", format!("Bearer {other_key}")),
                ("gitlab-agent-id", "7".into()),
            ],
        ),
        (
            "cookie without its CSRF token",
            vec![
                ("cookie", format!("_gitlab_kas={cookie_token}")),
                ("gitlab-agent-id", "7".into()),
            ],
        ),
        (
            "cookie with another CSRF token",
            vec![
                ("cookie", format!("_gitlab_kas={cookie_token}")),
                ("x-csrf-token", "forged".into()),
                ("gitlab-agent-id", "7".into()),
            ],
        ),
        (
            "no agent",
            vec![("authorization", format!("Bearer {}", token(2).0))],
        ),
        (
            "agent is not a number",
            vec![
                ("authorization", format!("Bearer {}", token(2).0)),
                ("gitlab-agent-id", "prod".into()),
            ],
        ),
        (
            "a user the mirror does not know",
            vec![
                ("authorization", format!("Bearer {}", token(999).0)),
                ("gitlab-agent-id", "7".into()),
            ],
        ),
    ];
    for (what, headers) in cases {
        let mut req = Request::get(PODS);
        for (name, value) in headers {
            req = req.header(name, value);
        }
        let res = app.send(req.body(Body::empty()).unwrap()).await;
        assert_eq!(res.status, 401, "{what}: {}", res.text());
        assert_unauthorized(&res);
    }
    assert!(api.requests().is_empty());
    // The cookie with its CSRF token, and the agent as a query parameter, do work.
    let req = Request::get(format!("{PODS}?gitlab-agent-id=7"))
        .header(
            header::COOKIE,
            format!("theme=dark; _gitlab_kas={cookie_token}"),
        )
        .header("x-csrf-token", csrf)
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.send(req).await.status, 200);
}

#[tokio::test]
async fn impersonation_exactly_and_nothing_of_the_client_leaks() {
    let (api, served, _dir) = cluster().await;
    let app = setup(&config(&served)).await;
    let (cookie_token, csrf) = token(3);
    let req = Request::get(format!(
        "{PODS}?labelSelector=app%3Dweb&gitlab-agent-id=7&limit=10"
    ))
    .header(header::COOKIE, format!("_gitlab_kas={cookie_token}"))
    .header("X-Csrf-Token", &csrf)
    .header("Gitlab-Agent-Id", "7")
    .header("Impersonate-User", "system:admin")
    .header("Impersonate-Group", "system:masters")
    .header("Impersonate-Extra-scopes", "everything")
    .header("Impersonate-Uid", "0")
    .header("Accept", "application/json")
    .header("X-Request-Id", "abc")
    .body(Body::empty())
    .unwrap();
    let res = app.send(req).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let sent = api.requests().pop().unwrap();
    assert_eq!(sent.path, "/api/v1/namespaces/apps/pods");
    assert_eq!(sent.query, "labelSelector=app%3Dweb&limit=10");
    assert_eq!(sent.impersonate_user.as_deref(), Some("gitlab:user:gmaint"));
    let mut groups = vec!["gitlab:user".to_owned()];
    groups.extend(roles("project", 11, "maintainer"));
    groups.extend(roles("group", 2, "maintainer"));
    assert_eq!(sent.impersonate_groups, groups);
    assert_eq!(sent.impersonate_uid, None);
    let extra: Vec<(String, Vec<String>)> = sent.impersonate_extra.clone().into_iter().collect();
    assert_eq!(
        extra,
        [
            ("agent.gitlab.com/access_type", "session_cookie"),
            ("agent.gitlab.com/config_project_id", "10"),
            ("agent.gitlab.com/id", "7"),
            ("agent.gitlab.com/username", "gmaint"),
        ]
        .map(|(k, v)| (k.to_owned(), vec![v.to_owned()]))
    );
    for name in ["cookie", "x-csrf-token", "gitlab-agent-id"] {
        assert_eq!(sent.header(name), None, "{name} reached the cluster");
    }
    // The kubeconfig's credential, never the user's.
    assert_eq!(sent.header("authorization"), Some("Bearer test-token"));
    assert_eq!(sent.header("accept"), Some("application/json"));
    assert_eq!(sent.header("x-request-id"), Some("abc"));

    // A bearer user: its token stays here too, and the access type says so.
    api.clear_requests();
    assert_eq!(get(&app, 2, 7, PODS).await.status, 200);
    let sent = api.requests().pop().unwrap();
    assert_eq!(sent.header("authorization"), Some("Bearer test-token"));
    assert_eq!(
        sent.impersonate_extra["agent.gitlab.com/access_type"],
        ["personal_access_token"]
    );
}

both_ways!(the_clusters_answers_pass_through);
async fn the_clusters_answers_pass_through(reach: Reach) {
    let world = streaming(reach).await;
    let (api, app) = (&world.api, &world.app);
    // The cluster's own 404 and its Status.
    let res = get(app, 2, 7, &format!("{PODS}/nope")).await;
    assert_eq!(res.status, 404);
    assert_eq!(res.headers.get("gitlab-unauthorized"), None);
    assert_eq!(res.json()["reason"], "NotFound");
    // RBAC refusing the impersonated user: the cluster's 403, unchanged.
    api.deny(|info| info.user == "gitlab:user:pdev" && info.resource == "secrets");
    let res = get(app, 2, 7, "/k8s-proxy/api/v1/namespaces/apps/secrets").await;
    assert_eq!(res.status, 403, "{}", res.text());
    assert_eq!(res.headers.get("gitlab-unauthorized"), None);
    assert_eq!(res.json()["reason"], "Forbidden");
    assert!(res.json()["message"]
        .as_str()
        .unwrap()
        .contains("gitlab:user:pdev"));
    // Writes: method and body forwarded.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "settings", "namespace": "apps"}, "data": {"a": "b"}});
    let res = app
        .send(
            bearer(
                2,
                7,
                Method::POST,
                "/k8s-proxy/api/v1/namespaces/apps/configmaps",
            )
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(cm.to_string()))
            .unwrap(),
        )
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    assert_eq!(
        api.get("configmaps", Some("apps"), "settings").unwrap()["data"]["a"],
        "b"
    );
    let res = app
        .send(
            bearer(
                2,
                7,
                Method::DELETE,
                "/k8s-proxy/api/v1/namespaces/apps/configmaps/settings",
            )
            .body(Body::empty())
            .unwrap(),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(api.get("configmaps", Some("apps"), "settings").is_none());
    // `..` could leave the cluster's API behind a prefixed server URL.
    let res = get(app, 2, 7, "/k8s-proxy/api/v1/../../other").await;
    assert_eq!(res.status, 400);
    assert_eq!(res.json()["kind"], "Status");
}

/// The next chunk of a streaming body, or None when it ends; panics after `wait`.
async fn next_chunk(body: &mut Body, wait: Duration) -> Option<String> {
    let frame = tokio::time::timeout(wait, body.frame())
        .await
        .expect("a chunk in time")?;
    let frame = frame.expect("body error");
    Some(String::from_utf8(frame.into_data().unwrap_or_default().to_vec()).unwrap())
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A cluster for the streaming tests, reached as SPEC 6 and 14 allow: agent 7 through its
/// kubeconfig context, or agent 9 (`robot`, `access_as: agent`) with no entry, through KAS.
struct Streaming {
    api: KubeApi,
    app: TestApp,
    agent: i64,
    _reached: Reached,
    _served: Served,
    _dir: TempDir,
}

/// The agents of [`setup`] reached as `reach` says (through KAS, agent 7 as its
/// `access_as: user` says).
pub async fn reached(reach: Reach, served: &Served) -> Reached {
    let agents = [("7", 7), ("8", 8), ("acme/agents:robot", 9)];
    let reached = Reached::new(reach, served, &agents, 10).await;
    reached.access_as_user(7, 10, true);
    reached
}

async fn streaming(reach: Reach) -> Streaming {
    let (api, served, dir) = cluster().await;
    let reached = reached(reach, &served).await;
    let app = setup(&reached.config("  own_namespace: envlens\n", "")).await;
    let agent = match reach {
        Reach::Kubeconfig => 7,
        Reach::Kas => 9,
    };
    Streaming {
        api,
        app,
        agent,
        _reached: reached,
        _served: served,
        _dir: dir,
    }
}

both_ways!(a_watch_streams_while_open_and_ends_when_the_client_leaves);
async fn a_watch_streams_while_open_and_ends_when_the_client_leaves(reach: Reach) {
    let world = streaming(reach).await;
    let (api, app, agent) = (&world.api, &world.app, world.agent);
    let req = bearer(
        2,
        agent,
        Method::GET,
        &format!("{PODS}?watch=true&resourceVersion=0"),
    )
    .body(Body::empty())
    .unwrap();
    let res = app.router.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    // The existing pods arrive as ADDED events first.
    let mut seen = String::new();
    while seen.matches("\"ADDED\"").count() < 2 {
        seen.push_str(&next_chunk(&mut body, Duration::from_secs(5)).await.unwrap());
    }
    assert_eq!(api.open_streams(), 1);
    // A new pod while the stream is open.
    api.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-3", "namespace": "apps"}, "spec": {"containers": []}}));
    let mut event = String::new();
    while !event.contains("web-3") {
        event.push_str(&next_chunk(&mut body, Duration::from_secs(5)).await.unwrap());
    }
    assert!(event.contains("\"ADDED\""), "{event}");
    // The client goes away: the cluster's stream closes too.
    drop(body);
    wait_until("the upstream watch closes", || api.open_streams() == 0).await;
}

both_ways!(followed_logs_arrive_as_written);
async fn followed_logs_arrive_as_written(reach: Reach) {
    let world = streaming(reach).await;
    let (api, app, agent) = (&world.api, &world.app, world.agent);
    api.set_pod_log("apps", "web-1", None, "first line\n");
    let req = bearer(
        2,
        agent,
        Method::GET,
        "/k8s-proxy/api/v1/namespaces/apps/pods/web-1/log?follow=true",
    )
    .body(Body::empty())
    .unwrap();
    let res = app.router.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    let mut text = String::new();
    while !text.contains("first line") {
        text.push_str(&next_chunk(&mut body, Duration::from_secs(5)).await.unwrap());
    }
    api.append_pod_log("apps", "web-1", "second line\n");
    while !text.contains("second line") {
        text.push_str(&next_chunk(&mut body, Duration::from_secs(5)).await.unwrap());
    }
    drop(body);
    wait_until("the upstream log follow closes", || api.open_streams() == 0).await;
}

fn kubeconfig_for(dir: &std::path::Path, server: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
             users:\n- name: u\n  user:\n    token: t\n"
        ),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn clusters_that_cannot_be_reached_are_502() {
    let dir = tempfile::tempdir().unwrap();
    // A port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_addr = closed.local_addr().unwrap();
    drop(closed);
    // A server that accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let (accepted_tx, mut accepted) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((socket, _)) = silent.accept().await {
            let _ = accepted_tx.send(socket);
        }
    });
    let yaml = format!(
        concat!(
            "kubernetes:\n  connect_timeout: 1s\n  response_timeout: 500ms\n  agents:\n",
            "  - agent: 7\n    context: c\n    kubeconfig: {}\n",
            "  - agent: acme/agents:robot\n    context: c\n    kubeconfig: {}\n"
        ),
        kubeconfig_for(&dir.path().join("a"), &format!("http://{closed_addr}")).display(),
        kubeconfig_for(&dir.path().join("b"), &format!("http://{silent_addr}")).display(),
    );
    let app = setup(&yaml).await;
    for (agent, what) in [(7, "cannot be reached"), (9, "did not answer")] {
        let started = Instant::now();
        let res = get(&app, 2, agent, PODS).await;
        assert_eq!(res.status, 502, "{}", res.text());
        assert!(started.elapsed() < Duration::from_secs(5));
        let status = res.json();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["code"], 502);
        assert!(
            status["message"].as_str().unwrap().contains(what),
            "{status}"
        );
        assert_eq!(res.headers.get("gitlab-unauthorized"), None);
    }
    // The silent server saw the request, and its connection was let go after the timeout.
    let socket = accepted.recv().await.expect("a connection");
    let mut buf = vec![0u8; 4096];
    let mut request = Vec::new();
    loop {
        socket.readable().await.unwrap();
        match socket.try_read(&mut buf) {
            Ok(0) => break,
            Ok(n) => request.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(String::from_utf8_lossy(&request).starts_with("GET /api/v1/namespaces/apps/pods"));
}

#[tokio::test]
async fn a_configuration_naming_a_missing_context_names_agent_and_context() {
    let (_api, served, _dir) = cluster().await;
    let yaml = format!(
        "kubernetes:\n  kubeconfig: {}\n  agents:\n  - agent: acme/agents:prod\n    context: nowhere\n",
        served.kubeconfig.display()
    );
    let settings = envlens::config::file::Settings::parse(&yaml).unwrap();
    let err = match envlens::k8s::clusters::Clusters::load(&settings.kubernetes, Default::default())
        .await
    {
        Ok(_) => panic!("a missing context must fail"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("acme/agents:prod"), "{err}");
    assert!(err.contains("\"nowhere\""), "{err}");

    // By path, with the context that exists: that agent goes there.
    let yaml = format!(
        "kubernetes:\n  agents:\n  - agent: ACME/agents:prod\n    context: test\n    kubeconfig: {}\n",
        served.kubeconfig.display()
    );
    let app = setup(&yaml).await;
    assert_eq!(get(&app, 2, 7, PODS).await.status, 200);
}

#[tokio::test]
async fn cors_for_configured_origins_with_credentials() {
    let (_api, served, _dir) = cluster().await;
    let yaml = format!(
        "{}cors:\n  allowed_origins: [https://gitlab.example.com]\n",
        config(&served)
    );
    let app = setup(&yaml).await;
    let preflight = |origin: &str| {
        Request::builder()
            .method(Method::OPTIONS)
            .uri(PODS)
            .header(header::ORIGIN, origin)
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, "GET")
            .header(
                header::ACCESS_CONTROL_REQUEST_HEADERS,
                "gitlab-agent-id,x-csrf-token",
            )
            .body(Body::empty())
            .unwrap()
    };
    let res = app.send(preflight("https://gitlab.example.com")).await;
    assert_eq!(res.status, 200);
    let h = &res.headers;
    assert_eq!(
        h[header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "https://gitlab.example.com"
    );
    assert_eq!(h[header::ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
    assert_eq!(
        h[header::ACCESS_CONTROL_ALLOW_HEADERS],
        "gitlab-agent-id,x-csrf-token"
    );
    assert!(h[header::ACCESS_CONTROL_ALLOW_METHODS]
        .to_str()
        .unwrap()
        .contains("DELETE"));
    let res = app.send(preflight("https://evil.example.com")).await;
    assert_eq!(res.headers.get(header::ACCESS_CONTROL_ALLOW_ORIGIN), None);

    // Real requests: the answer is readable by the allowed origin, the 401 too.
    let res = app
        .send(
            bearer(2, 7, Method::GET, PODS)
                .header(header::ORIGIN, "https://gitlab.example.com")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 200);
    assert_eq!(
        res.headers[header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "https://gitlab.example.com"
    );
    let res = app
        .send(
            Request::get(PODS)
                .header(header::ORIGIN, "https://gitlab.example.com")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_unauthorized(&res);
    assert_eq!(
        res.headers[header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "https://gitlab.example.com"
    );
    assert!(res.headers[header::ACCESS_CONTROL_EXPOSE_HEADERS]
        .to_str()
        .unwrap()
        .contains("gitlab-unauthorized"));
}

both_ways!(decisions_are_reused_for_the_configured_time);
async fn decisions_are_reused_for_the_configured_time(reach: Reach) {
    let (_api, served, _dir) = cluster().await;
    let reached = reached(reach, &served).await;
    let promote = json!({"event_name": "user_add_to_team", "user_id": 5, "user_username": "rep",
        "project_id": 11, "project_path_with_namespace": "acme/apps/web", "project_path": "web",
        "project_name": "web", "project_visibility": "private", "access_level": "Developer"});
    for (ttl, after_promotion) in [("0s", 200), ("1h", 401)] {
        let kubernetes = format!("  own_namespace: envlens\n  access_cache: {ttl}\n");
        let app = setup(&reached.config(&kubernetes, "")).await;
        assert_unauthorized(&get(&app, 5, 7, PODS).await);
        let res = app.system_hook(&promote).await;
        assert!(res.status.is_success(), "{}", res.text());
        let res = get(&app, 5, 7, PODS).await;
        assert_eq!(
            res.status,
            after_promotion,
            "access_cache {ttl}: {}",
            res.text()
        );
    }
}

/// A cluster URL with a path prefix, as behind Rancher: a path whose segments decode to `.` or
/// `..` (however encoded) never reaches it, and the rest reach it under the prefix unchanged.
#[tokio::test]
async fn encoded_dot_segments_never_leave_the_prefix() {
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let recorder = {
        let seen = seen.clone();
        axum::Router::new().fallback(move |uri: axum::http::Uri| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(uri.to_string());
                axum::Json(json!({"kind": "PodList", "apiVersion": "v1", "items": []}))
            }
        })
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, recorder).await });
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig_for(dir.path(), &format!("http://{addr}/prefix"));
    let app = setup(&format!(
        "kubernetes:\n  kubeconfig: {}\n  agents:\n  - agent: 7\n    context: c\n",
        kubeconfig.display()
    ))
    .await;

    for path in [
        "/k8s-proxy/%2e%2e/%2e%2e/api/graphql",
        "/k8s-proxy/%2E%2E/%2E%2E/api/graphql",
        "/k8s-proxy/api/.%2e/.%2e/x",
        "/k8s-proxy/api/%2e/v1",
        "/k8s-proxy/api/..%2f..%2fx",
        "/k8s-proxy/api/v1/%252e%252e/x",
        "/k8s-proxy/api/v1/a%2Fb",
        "/k8s-proxy/api/v1/a%5Cb",
        "/k8s-proxy/api/v1/a%00b",
        "/k8s-proxy/api/v1/%zz",
        "/k8s-proxy/api//v1",
    ] {
        let res = get(&app, 2, 7, path).await;
        assert_eq!(res.status, 400, "{path}: {}", res.text());
        assert_eq!(res.json()["kind"], "Status", "{path}");
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    let res = get(
        &app,
        2,
        7,
        &format!("{PODS}?labelSelector=app%3Dweb&gitlab-agent-id=7"),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        *seen.lock().unwrap(),
        ["/prefix/api/v1/namespaces/apps/pods?labelSelector=app%3Dweb"]
    );
}

/// The series on `/metrics`: every line that is not a comment.
async fn series(app: &TestApp) -> Vec<String> {
    let res = app
        .send(Request::get("/metrics").body(Body::empty()).unwrap())
        .await;
    assert_eq!(res.status, 200);
    res.text()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// SPEC 13: the labels of proxied requests are the resources discovery knows; a thousand
/// requests for made-up resources, as anyone with access to an agent may send, add a handful
/// of series, not a thousand.
#[tokio::test]
async fn made_up_resource_names_leave_metrics_bounded() {
    use rand::Rng;
    let (_api, served, _dir) = cluster().await;
    let app = setup(&config(&served)).await;
    assert_eq!(get(&app, 2, 7, PODS).await.status, 200);
    let before = series(&app).await;
    let mut rng = rand::rng();
    for i in 0..1_000 {
        let name: String = (0..12)
            .map(|_| char::from(b'a' + rng.random_range(0..26)))
            .collect();
        let path = match i % 4 {
            0 => format!("/k8s-proxy/api/v1/namespaces/apps/{name}"),
            1 => format!("/k8s-proxy/apis/{name}.example.com/v1/namespaces/apps/{name}"),
            2 => format!("/k8s-proxy/api/v1/namespaces/apps/pods/web-1/{name}"),
            _ => format!("/k8s-proxy/apis/apps/v1/namespaces/apps/{name}/web"),
        };
        let res = get(&app, 2, 7, &path).await;
        assert!(res.status.is_client_error(), "{path}: {}", res.status);
    }
    let after = series(&app).await;
    // A few new label sets (`other` by verb and answer, the proxy's route by answer), each
    // a histogram's dozen lines; not one per made-up name.
    let new: Vec<&String> = after.iter().filter(|l| !before.contains(l)).collect();
    let new_label_sets: std::collections::BTreeSet<&str> = new
        .iter()
        .filter_map(|l| l.split_once('}').map(|(labels, _)| labels))
        .filter(|l| !l.contains("le=\""))
        .collect();
    assert!(
        new_label_sets.len() <= 16 && after.len() <= before.len() + 100,
        "{} series after, {} before: {new_label_sets:#?}",
        after.len(),
        before.len()
    );
    assert!(after
        .iter()
        .any(|l| l.starts_with("envlens_cluster_requests_total{")
            && l.contains("resource=\"other\"")));
    assert!(after.iter().any(
        |l| l.starts_with("envlens_cluster_requests_total{") && l.contains("resource=\"pods\"")
    ));
}
