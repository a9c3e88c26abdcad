//! Fuzzing on stable Rust: every parser of outside input gets mutated inputs for a bounded time,
//! from seeds of valid input, with an oracle beyond "no panic" where one exists (no 5xx, every
//! GraphQL error coded, nothing outside the prefix reaching a cluster, no forged token
//! accepted).
//!
//! The mutator is deterministic: a target's inputs are a function of its name and
//! `ENVLENS_FUZZ_SEED` (default 0); how many it runs depends on `ENVLENS_FUZZ_SECONDS` (per
//! target, default 0.4 s, so the suite stays fast). Run longer with, e.g.,
//! `ENVLENS_FUZZ_SECONDS=60 cargo test --release --test integration fuzz:: -- --nocapture`;
//! each target prints how many inputs it ran. A failing input is printed (escaped) with the
//! panic; it then belongs in a regular test.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Method, Request};
use envlens::auth::mint_session;
use futures_util::FutureExt;
use serde_json::json;

use crate::support::*;

/// xorshift64*: small, fast, and the same everywhere.
struct Rng(u64);

impl Rng {
    fn for_target(name: &str) -> Rng {
        let seed: u64 = std::env::var("ENVLENS_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        // FNV-1a of the name, mixed with the seed.
        let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
        for b in name.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        Rng(h | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Tokens that mean something to the parsers: JSON and GraphQL punctuation, escapes, numbers at
/// the edges, path tricks, NUL, long runs.
const DICTIONARY: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "\\",
    "\\u0000",
    "\\ud800",
    "\\u00e9",
    "null",
    "true",
    "-1",
    "0",
    "9223372036854775808",
    "1e999",
    "-0.0",
    "%2e%2e",
    "%2f",
    "%00",
    "..",
    "/",
    "//",
    "\u{0}",
    "\u{feff}",
    "é",
    "---\n",
    "\n",
    "#",
    "...",
    "__typename",
    "$v",
    "@skip(if: true)",
    "fragment F on Query { __typename }",
    "...F",
    "{ a }",
    "\"\"\"",
    "!",
    "=",
    "==",
    ",",
    " in (",
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "status",
    "items",
    "ownerReferences",
    "selector",
    "matchLabels",
    "labels",
    "&",
    "*a",
    "!!binary",
    "<<: *a",
    "~",
    "%",
    ".",
];

/// One to four mutations of a seed: a byte changed, a token inserted, a range deleted or
/// repeated, the text cut, or spliced with another seed.
fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut data = rng.pick(seeds).clone();
    for _ in 0..=rng.below(4) {
        let len = data.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] = rng.next() as u8;
            }
            1 | 2 => {
                let at = rng.below(len + 1);
                let token = rng.pick(DICTIONARY).as_bytes();
                data.splice(at..at, token.iter().copied());
            }
            3 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(16)).min(len);
                data.drain(start..end);
            }
            4 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(64)).min(len);
                let piece = data[start..end].repeat(1 + rng.below(8));
                data.splice(start..start, piece);
            }
            5 => data.truncate(rng.below(len + 1)),
            _ => {
                let other = rng.pick(seeds);
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
        }
    }
    data
}

fn budget() -> Duration {
    let seconds: f64 = std::env::var("ENVLENS_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.4);
    Duration::from_secs_f64(seconds)
}

/// Runs `check` on mutated inputs until the budget is spent; on a panic, names the input.
async fn fuzz<F, Fut>(name: &str, seeds: &[&str], mut check: F)
where
    F: FnMut(Vec<u8>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let seeds: Vec<Vec<u8>> = seeds.iter().map(|s| s.as_bytes().to_vec()).collect();
    let mut rng = Rng::for_target(name);
    let mut runs = 0u64;
    // The seeds themselves first, outside the budget (the first requests warm caches up).
    let mut queue: Vec<Vec<u8>> = seeds.clone();
    let mut started = Instant::now();
    while started.elapsed() < budget() || !queue.is_empty() {
        let input = match queue.pop() {
            Some(seed) => {
                started = Instant::now();
                seed
            }
            None => mutate(&mut rng, &seeds),
        };
        let shown = String::from_utf8_lossy(&input).escape_debug().to_string();
        if let Err(panic) = AssertUnwindSafe(check(input)).catch_unwind().await {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("fuzz target {name}, run {runs}: {why}\ninput: \"{shown}\"");
        }
        runs += 1;
    }
    eprintln!("fuzz target {name}: {runs} runs in {:?}", started.elapsed());
}

fn text(input: &[u8]) -> String {
    String::from_utf8_lossy(input).into_owned()
}

/// A mirror for the REST and GraphQL targets: a group, a project, a user, an agent.
async fn mirror() -> TestApp {
    let app = TestApp::new().await;
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/identity",
            &json!({"groups": [{"id": 1, "full_path": "acme"}],
                    "projects": [{"id": 10, "full_path": "acme/agents", "visibility": "private"}],
                    "users": [{"id": 1, "username": "alice", "admin": true}],
                    "members": []}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    app.internal(
        Method::PUT,
        "/api/v4/internal/kubernetes/agents/7",
        &json!({"project_id": 10, "name": "prod"}),
    )
    .await;
    app
}

#[tokio::test]
async fn rest_bodies_and_both_webhooks_are_never_a_5xx() {
    let app = mirror().await;
    let seeds = [
        r#"{"groups": [{"id": 2, "full_path": "acme/sub"}], "projects": [{"id": 11, "full_path": "acme/sub/p", "visibility": "internal"}], "users": [{"id": 2, "username": "bob", "admin": false}], "members": [{"user_id": 2, "source_type": "project", "source_id": 11, "access_level": 30}]}"#,
        r#"{"project_id": 10, "name": "prod"}"#,
        r#"{"agent_id": 7, "agent_config": {"ci_access": {"groups": [{"id": "acme", "default_namespace": "apps", "environments": ["production"], "protected_branches_only": true}], "projects": [{"id": "acme/agents"}]}, "user_access": {"access_as": {"user": {}}, "groups": [{"id": "acme"}]}}}"#,
        r#"{"deployment": {"id": 1, "iid": 1, "status": "created", "ref": "main", "sha": "abc", "tag": false, "created_at": "2026-11-21T10:00:00Z"}, "project": {"id": 10, "full_path": "acme/agents"}, "environment": {"id": 5, "name": "production", "slug": "production", "tier": "production"}, "job": {"id": 3, "name": "deploy", "protected_ref": true}, "kubernetes": {"agent": "acme/agents:prod", "namespace": "apps"}}"#,
        r#"{"event_name": "user_add_to_team", "user_id": 3, "user_username": "carol", "project_id": 10, "access_level": "Developer", "project_path_with_namespace": "acme/agents", "project_visibility": "private"}"#,
        r#"{"event_name": "group_rename", "group_id": 1, "full_path": "acme2", "old_full_path": "acme"}"#,
        r#"{"object_kind": "deployment", "deployment_id": 1, "status": "success", "status_changed_at": "2026-11-21 10:00:00 +0200", "environment": "production", "project": {"id": 10, "path_with_namespace": "acme/agents", "visibility_level": 0}, "ref": "main", "short_sha": "abc"}"#,
    ];
    let token = internal_token();
    let mut which = Rng::for_target("rest endpoints");
    fuzz("rest bodies and webhooks", &seeds, |input| {
        let body = text(&input);
        let endpoint = which.below(6);
        let app = &app;
        let token = token.clone();
        async move {
            let res = match endpoint {
                0 => {
                    app.internal_raw(Method::PUT, "/api/v4/internal/identity", &token, body)
                        .await
                }
                1 => {
                    app.internal_raw(
                        Method::PUT,
                        "/api/v4/internal/kubernetes/agents/7",
                        &token,
                        body,
                    )
                    .await
                }
                2 => {
                    app.internal_raw(
                        Method::POST,
                        "/api/v4/internal/kubernetes/agent_configuration",
                        &token,
                        body,
                    )
                    .await
                }
                3 => {
                    app.internal_raw(Method::POST, "/api/v4/internal/deployments", &token, body)
                        .await
                }
                4 => app.hook("System Hook", body, None).await,
                _ => app.hook("Deployment Hook", body, None).await,
            };
            assert!(res.status.as_u16() < 500, "{}: {}", res.status, res.text());
            if !res.status.is_success() && res.status != 409 {
                assert!(res.json()["error"]["code"].is_string(), "{}", res.text());
            }
        }
    })
    .await;
}

#[tokio::test]
async fn graphql_documents_and_variables_are_never_a_5xx_and_every_error_is_coded() {
    let app = mirror().await;
    let (token, _) = mint_session(SESSION_KEY, 1, "alice", Duration::from_secs(3600)).unwrap();
    let seeds = [
        r#"{"query": "query P($p: ID!, $n: String!) { project(fullPath: $p) { environment(name: $n) { slug lastDeployment(status: SUCCESS) { agent { id name project { fullPath } kubernetesNamespace } } } } }", "variables": {"p": "acme/agents", "n": "production"}}"#,
        r#"{"query": "{ currentUser { id username } a: __typename ...F } fragment F on Query { group(fullPath: \"acme\") { id fullPath } }"}"#,
        r#"{"query": "query Q($t: DeploymentTier, $f: Int) { group(fullPath: \"acme\") { environments(tier: $t, first: $f, search: \"p\") { nodes { name } pageInfo { endCursor hasNextPage } } } }", "operationName": "Q", "variables": {"t": "PRODUCTION", "f": 5}}"#,
        r#"{"query": "{ project(fullPath: \"acme/agents\") { clusterAgent(name: \"prod\") { id name } environments(states: [\"available\"], first: 2, after: \"x\") { count nodes { id } } } }"}"#,
    ];
    fuzz("graphql", &seeds, |input| {
        let req = Request::post("/api/graphql")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(input))
            .unwrap();
        let app = &app;
        async move {
            let res = app.send(req).await;
            assert!(res.status.as_u16() < 500, "{}: {}", res.status, res.text());
            let body = res.json();
            for error in body["errors"].as_array().into_iter().flatten() {
                assert!(error["extensions"]["code"].is_string(), "{body}");
            }
        }
    })
    .await;
}

#[tokio::test]
async fn proxy_paths_and_headers_never_leave_the_prefix() {
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let recorder = {
        let seen = seen.clone();
        axum::Router::new().fallback(move |uri: axum::http::Uri| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(uri.path().to_owned());
                axum::Json(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}))
            }
        })
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, recorder).await });
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}/prefix\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
             users:\n- name: u\n  user:\n    token: t\n"
        ),
    )
    .unwrap();
    let app = TestApp::with_config(&format!(
        "kubernetes:\n  kubeconfig: {}\n  agents:\n  - agent: 7\n    context: c\n",
        kubeconfig.display()
    ))
    .await;
    let identity = json!({"groups": [{"id": 1, "full_path": "acme"}],
        "projects": [{"id": 10, "full_path": "acme/agents", "visibility": "private"}],
        "users": [{"id": 1, "username": "alice", "admin": true}], "members": []});
    app.internal(Method::PUT, "/api/v4/internal/identity", &identity)
        .await;
    app.internal(
        Method::PUT,
        "/api/v4/internal/kubernetes/agents/7",
        &json!({"project_id": 10, "name": "prod"}),
    )
    .await;
    app.internal(Method::POST, "/api/v4/internal/kubernetes/agent_configuration",
        &json!({"agent_id": 7, "agent_config": {"user_access": {"access_as": {"agent": {}}, "projects": [{"id": "acme/agents"}]}}})).await;
    let (token, _) = mint_session(SESSION_KEY, 1, "alice", Duration::from_secs(3600)).unwrap();
    let seeds = [
        "/api/v1/namespaces/apps/pods?labelSelector=app%3Dweb&watch=false",
        "/apis/apps/v1/namespaces/apps/deployments/web",
        "/api/v1/namespaces/a/pods/web-1/log?follow=false&container=app",
        "/version",
    ];
    fuzz("proxy paths and headers", &seeds, |input| {
        let path = format!("/k8s-proxy{}", text(&input));
        let app = &app;
        let header_value = text(&input[..input.len().min(40)]);
        let token = token.clone();
        let seen = seen.clone();
        async move {
            // Paths that are no URI at all never reach the router.
            let Ok(uri) = path.parse::<axum::http::Uri>() else {
                return;
            };
            let mut req = Request::get(uri)
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .header("Gitlab-Agent-Id", "7");
            if let Ok(value) = axum::http::HeaderValue::from_str(&header_value) {
                req = req
                    .header("Impersonate-User", value.clone())
                    .header("x-fuzz", value);
            }
            let res = app.send(req.body(Body::empty()).unwrap()).await;
            assert!(
                res.status.as_u16() < 500 || res.status == 502,
                "{}: {}",
                res.status,
                res.text()
            );
            for reached in seen.lock().unwrap().drain(..) {
                let rest = reached
                    .strip_prefix("/prefix/")
                    .unwrap_or_else(|| panic!("left the prefix: {reached}"));
                for segment in rest.split('/') {
                    let decoded = percent_decode(segment);
                    assert!(
                        decoded != "." && decoded != ".." && !decoded.contains(['/', '\\', '\0']),
                        "{reached}"
                    );
                }
            }
        }
    })
    .await;
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        if let (b'%', Some(Ok(b))) = (bytes[i], hex.map(|h| u8::from_str_radix(h, 16))) {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn session_tokens_forged_from_a_real_one_are_refused() {
    let keys = keys();
    let (token, csrf) = mint_session(SESSION_KEY, 1, "alice", Duration::from_secs(3600)).unwrap();
    let signed = token.rsplit_once('.').unwrap().0.to_owned();
    let seeds = [token.as_str()];
    fuzz("jwt", &seeds, |input| {
        let candidate = text(&input);
        let keys = &keys;
        let (signed, csrf) = (&signed, &csrf);
        async move {
            for (name, value) in [
                ("authorization", format!("Bearer {candidate}")),
                ("cookie", format!("_gitlab_kas={candidate}")),
            ] {
                let Ok(value) = axum::http::HeaderValue::from_str(&value) else {
                    continue;
                };
                let req = Request::get("/api/user")
                    .header(name, value)
                    .header("x-csrf-token", csrf.as_str())
                    .body(())
                    .unwrap();
                let (parts, ()) = req.into_parts();
                if let Ok(session) = envlens::auth::verify_session(&parts, keys) {
                    // Only the signed header and claims themselves pass (the signature's own
                    // base64 may be written more than one way).
                    // As sent: a cookie may be quoted once (RFC 6265).
                    let sent = candidate.trim();
                    let sent = match name {
                        "cookie" => sent
                            .strip_prefix('"')
                            .and_then(|v| v.strip_suffix('"'))
                            .unwrap_or(sent),
                        _ => sent,
                    };
                    let head = sent.rsplit_once('.').map(|(h, _)| h);
                    assert_eq!(head, Some(signed.as_str()), "accepted {candidate}");
                    assert_eq!(session.user_id, 1);
                }
            }
        }
    })
    .await;
}

#[tokio::test]
async fn manifests_for_envlens_health_never_panic() {
    let seeds = [
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: apps\n  labels: {app: web}\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {app: web}\nstatus:\n  replicas: 2\n  updatedReplicas: 2\n  availableReplicas: 1\n  observedGeneration: 1\n  conditions:\n  - type: Available\n    status: \"False\"\n",
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: apps}\nspec:\n  selector: {app: web}\n  type: LoadBalancer\nstatus:\n  loadBalancer: {}\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web-1\n  namespace: apps\n  labels: {app: web}\n  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-1, uid: u1, controller: true}]\nstatus:\n  phase: Running\n  containerStatuses: [{name: app, ready: false, restartCount: 3, state: {waiting: {reason: CrashLoopBackOff}}}]\n",
        r#"{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "a"}, "status": {"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]}}, {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "i", "namespace": "a"}, "spec": {"rules": [{"http": {"paths": [{"backend": {"service": {"name": "web"}}}]}}]}}]}"#,
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: &m {name: data, namespace: apps}\nspec: {volumeName: pv-1}\nstatus: {phase: Pending}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: *m\n",
    ];
    fuzz("manifests", &seeds, |input| async move {
        let mut out = Vec::new();
        let mut err = Vec::new();
        for format in [
            envlens::cli::health::Format::Table,
            envlens::cli::health::Format::Json,
        ] {
            envlens::cli::health::run(
                &[],
                format,
                &Default::default(),
                &mut input.as_slice(),
                &mut out,
                &mut err,
            )
            .expect("writes to memory");
        }
        // The same objects through the graph: owners, selectors, volumes.
        let manifests = envlens::resources::manifests::parse(&text(&input));
        let trees: Vec<_> = manifests
            .objects
            .iter()
            .filter_map(|o| envlens::resources::object::parse(&o.to_string()).ok())
            .collect();
        for tree in &trees {
            let _ = envlens::resources::health::health(tree);
        }
        let _ = envlens::resources::graph::Nodes::read(&trees, true).edges();
    })
    .await;
}

#[test]
fn the_mutator_is_deterministic() {
    let seeds = vec![b"{\"a\": [1, 2]}".to_vec()];
    let run = || {
        let mut rng = Rng::for_target("same");
        (0..50)
            .map(|_| mutate(&mut rng, &seeds))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
    let mut rng = Rng::for_target("other");
    assert_ne!(
        run(),
        (0..50)
            .map(|_| mutate(&mut rng, &seeds))
            .collect::<Vec<_>>()
    );
}
