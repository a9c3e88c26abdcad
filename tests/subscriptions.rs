//! GraphQL subscriptions over WebSocket (SPEC 8.2), against a real socket: both protocols,
//! authentication in `connection_init`, the `Origin` check, the bounds, `resourceGroupUpdated`
//! following the test Kubernetes API server (a Pod's change is a message about that Pod,
//! coalescing, RBAC and `user_access` taken away while it runs, and the property that the
//! messages applied in order give a fresh answer), and `environmentsUpdated` across two
//! servers on one database (two processes: tests/replicas.rs) and across a reconnection of
//! the listening connection.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request};
use envlens::auth::mint_session;
use envlens::config::file::Settings;
use envlens::config::Limits;
use envlens::graphql::SocketLimits;
use envlens::state::AppState;
use envlens::web::Site;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::support::environment::{self, NS};
use crate::support::kas::{ENVLENS_TOKEN, ENVLENS_USER};
use crate::support::kube_api::{KubeApi, Served};
use crate::support::reach::{both_ways, Reach, Reached};
use crate::support::*;

const PUBLIC_URL: &str = "https://envlens.example.com";
const DEV: (i64, &str) = (2, "dev");
const REP: (i64, &str) = (3, "rep");
/// Environment `production` of acme/apps/web (see `support::environment`).
const PRODUCTION: &str = "gid://gitlab/Environment/100";

const GROUP_FIELDS: &str = "health healthMessage warnings errors { apiVersion kind code message }";
const RESOURCE_FIELDS: &str = "uid apiVersion kind namespace name labels health { status message }
    manifest events { type reason message count }";

/// An envlens on a socket, over the test cluster, with GitLab's side recorded.
pub(crate) struct Server {
    pub(crate) app: TestApp,
    pub(crate) addr: SocketAddr,
    reached: Reached,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn cluster() -> (KubeApi, Served, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment::environment(&api);
    let served = api.serve(dir.path()).await;
    (api, served, dir)
}

/// Agent 7 of `served` reached as `reach` says (through KAS, as its `access_as: user` says).
async fn reached(reach: Reach, served: &Served) -> Reached {
    let reached = Reached::new(reach, served, &[("7", 7)], 10).await;
    reached.access_as_user(7, 10, true);
    reached
}

/// The state of a server reaching the cluster as `reached` says, with more of the
/// `kubernetes` section in `extra`.
async fn state(reached: &Reached, extra: &str, db: sqlx::PgPool) -> AppState {
    let yaml = reached.config(
        &format!("  response_timeout: 3s\n{extra}"),
        "cors:\n  allowed_origins: [https://gitlab.example.com]\n",
    );
    let settings = Settings::parse(&yaml).unwrap();
    let clusters = clusters(&settings).await;
    AppState::new(db, keys(), Limits::default())
        .with_clusters(clusters, settings.cors)
        .with_site(Site::new(PUBLIC_URL, envlens::web::DEFAULT_SESSION_LIFETIME).unwrap())
}

async fn listen(state: AppState) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(envlens::run(
        state,
        listener,
        async { stopped.await.unwrap_or(()) },
        Duration::from_secs(1),
    ));
    (addr, stop)
}

async fn start_with(reach: Reach, served: &Served, extra: &str, limits: SocketLimits) -> Server {
    let reached = reached(reach, served).await;
    let database = postgres::fresh_database().await;
    let state = state(&reached, extra, (*database).clone())
        .await
        .with_socket_limits(limits);
    let (addr, stop) = listen(state.clone()).await;
    let app = TestApp::owning(state, database);
    environment::seed(&app).await;
    Server {
        app,
        addr,
        reached,
        _stop: stop,
    }
}

pub(crate) async fn start(reach: Reach, served: &Served) -> Server {
    start_with(reach, served, "", SocketLimits::default()).await
}

pub(crate) fn bearer(user: (i64, &str)) -> String {
    let (token, _) = mint_session(SESSION_KEY, user.0, user.1, Duration::from_secs(600)).unwrap();
    format!("Bearer {token}")
}

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A GraphQL-over-WebSocket client of either protocol.
pub(crate) struct Client {
    ws: Socket,
    legacy: bool,
}

/// Opens a socket with `protocol` and extra `headers`; the handshake's refusal as
/// `Err((status, body))`.
async fn open(
    addr: SocketAddr,
    query: &str,
    protocol: &str,
    headers: &[(&str, &str)],
) -> Result<Client, (u16, String)> {
    let mut request = format!("ws://{addr}/api/graphql{query}")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", protocol.parse().unwrap());
    for (name, value) in headers {
        let name = axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((ws, response)) => {
            assert_eq!(
                response.headers()["sec-websocket-protocol"],
                protocol,
                "the server speaks the protocol asked for"
            );
            Ok(Client {
                ws,
                legacy: protocol == "graphql-ws",
            })
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let status = response.status().as_u16();
            let body = response
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            Err((status, body))
        }
        Err(e) => panic!("handshake: {e}"),
    }
}

/// What the server sent next: a message, or the socket's close (code and reason).
#[derive(Debug)]
pub(crate) enum Received {
    Message(Value),
    Closed(u16, String),
}

impl Client {
    pub(crate) async fn connect(addr: SocketAddr, protocol: &str, user: (i64, &str)) -> Client {
        let mut client = open(addr, "", protocol, &[]).await.unwrap();
        client
            .send(json!({"type": "connection_init", "payload": {"Authorization": bearer(user)}}))
            .await;
        let ack = client.message().await;
        assert_eq!(ack["type"], "connection_ack", "{ack}");
        client
    }

    pub(crate) async fn send(&mut self, message: Value) {
        self.ws
            .send(Message::Text(message.to_string().into()))
            .await
            .unwrap();
    }

    pub(crate) async fn subscribe(&mut self, id: &str, query: &str, variables: Value) {
        let kind = if self.legacy { "start" } else { "subscribe" };
        self.send(
            json!({"id": id, "type": kind, "payload": {"query": query, "variables": variables}}),
        )
        .await;
    }

    /// The next message or close within `wait`, pings skipped; `None` if nothing came.
    pub(crate) async fn receive_within(&mut self, wait: Duration) -> Option<Received> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .ok()?;
            match frame {
                Some(Ok(Message::Text(text))) => {
                    let value: Value = serde_json::from_str(&text).unwrap();
                    if matches!(value["type"].as_str(), Some("ping" | "pong" | "ka")) {
                        continue;
                    }
                    return Some(Received::Message(value));
                }
                Some(Ok(Message::Close(frame))) => {
                    let (code, reason) = frame
                        .map(|f| (u16::from(f.code), f.reason.to_string()))
                        .unwrap_or((1005, String::new()));
                    return Some(Received::Closed(code, reason));
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return Some(Received::Closed(1006, String::new())),
            }
        }
    }

    async fn receive(&mut self) -> Received {
        self.receive_within(Duration::from_secs(10))
            .await
            .expect("a message within 10 s")
    }

    pub(crate) async fn message(&mut self) -> Value {
        match self.receive().await {
            Received::Message(m) => m,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    /// The payload of the next result of subscription `id`.
    pub(crate) async fn next_payload(&mut self, id: &str) -> Value {
        let m = self.message().await;
        let kind = if self.legacy { "data" } else { "next" };
        assert_eq!(m["type"], kind, "{m}");
        assert_eq!(m["id"], id, "{m}");
        m["payload"].clone()
    }

    async fn closed(&mut self) -> (u16, String) {
        match self.receive().await {
            Received::Closed(code, reason) => (code, reason),
            other => panic!("expected the socket to close, got {other:?}"),
        }
    }
}

pub(crate) fn group_subscription() -> String {
    format!(
        "subscription($id: ID!) {{ resourceGroupUpdated(environmentId: $id) {{ complete {GROUP_FIELDS}
            upserted {{ {RESOURCE_FIELDS} }} removed edgesAdded {{ from to type }} edgesRemoved {{ from to type }} }} }}"
    )
}

/// A reader's view of a resource group, as a client would keep it.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct View {
    resources: BTreeMap<String, Value>,
    edges: BTreeSet<String>,
    pub(crate) state: Value,
}

fn edge_key(e: &Value) -> String {
    format!("{} {} {}", e["from"], e["to"], e["type"])
}

fn state_of(group: &Value) -> Value {
    json!({"health": group["health"], "healthMessage": group["healthMessage"],
           "warnings": group["warnings"], "errors": group["errors"]})
}

impl View {
    /// Applies one `resourceGroupUpdated` message.
    pub(crate) fn apply(&mut self, update: &Value) {
        if update["complete"] == true {
            *self = View::default();
        }
        for uid in update["removed"].as_array().unwrap() {
            self.resources.remove(uid.as_str().unwrap());
        }
        for r in update["upserted"].as_array().unwrap() {
            self.resources
                .insert(r["uid"].as_str().unwrap().to_owned(), r.clone());
        }
        for e in update["edgesRemoved"].as_array().unwrap() {
            self.edges.remove(&edge_key(e));
        }
        for e in update["edgesAdded"].as_array().unwrap() {
            self.edges.insert(edge_key(e));
        }
        self.state = state_of(update);
    }

    /// The view of a `resourceGroup` answer.
    pub(crate) fn of(group: &Value) -> View {
        View {
            resources: group["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["uid"].as_str().unwrap().to_owned(), r.clone()))
                .collect(),
            edges: group["edges"]
                .as_array()
                .unwrap()
                .iter()
                .map(edge_key)
                .collect(),
            state: state_of(group),
        }
    }

    fn names(&self) -> Vec<String> {
        self.resources
            .values()
            .map(|r| format!("{} {}", r["kind"], r["name"]).replace('"', ""))
            .collect()
    }
}

/// A fresh `resourceGroup` of production, as `user`, through the router.
pub(crate) async fn fresh(app: &TestApp, user: (i64, &str)) -> Value {
    let query = format!(
        r#"{{ project(fullPath: "acme/apps/web") {{ environment(name: "production") {{ resourceGroup {{
            {GROUP_FIELDS} resources {{ {RESOURCE_FIELDS} }} edges {{ from to type }} }} }} }} }}"#
    );
    let req = Request::post("/api/graphql")
        .header(header::AUTHORIZATION, bearer(user))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({ "query": query }).to_string()))
        .unwrap();
    let res = app.send(req).await;
    assert_eq!(res.status, 200, "{}", res.text());
    let body = res.json();
    assert!(body.get("errors").is_none(), "{body}");
    body["data"]["project"]["environment"]["resourceGroup"].clone()
}

/// The update in a `next` payload, after checking it carries no error.
pub(crate) fn update_of(payload: &Value) -> &Value {
    assert!(payload.get("errors").is_none(), "{payload}");
    &payload["data"]["resourceGroupUpdated"]
}

fn pod_with_phase(api: &KubeApi, name: &str, phase: &str) {
    let mut pod = api.get("pods", Some(NS), name).unwrap();
    pod["status"] = json!({"phase": phase});
    api.insert(pod);
}

both_ways!(both_protocols_send_the_whole_group_then_a_changed_pod_alone);
/// Through GitLab's agent server, agent 7 (`access_as: user`) has no entry, KAS presents
/// envlens' token's user, and the viewer is judged by reviews (SPEC 14).
async fn both_protocols_send_the_whole_group_then_a_changed_pod_alone(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let server = start(reach, &served).await;
    whole_group_then_a_changed_pod(&api, &server).await;
    if let Some(through) = &server.reached.kas {
        assert!(
            through
                .kas
                .received()
                .iter()
                .any(|(_, path, _)| path.contains("watch=true")),
            "the watches went through KAS"
        );
    }
}

both_ways!(a_watch_failing_anew_is_told_anew);
/// Pods' watch fails, then fails otherwise (as a connection dropped while the agent leaves,
/// then KAS saying the agent is gone): the subscriber is told the new failure when it comes,
/// with nothing else to carry it (the viewer's access is rechecked only every minute here).
/// It was told the first failure only, until something else in the namespace changed.
async fn a_watch_failing_anew_is_told_anew(reach: Reach) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (api, served, _dir) = cluster().await;
    let server = start_with(
        reach,
        &served,
        "  access_cache: 60s\n",
        SocketLimits::default(),
    )
    .await;
    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    client
        .subscribe("g", &group_subscription(), json!({"id": PRODUCTION}))
        .await;
    let mut view = View::default();
    view.apply(update_of(&client.next_payload("g").await));
    assert_eq!(view.state["errors"], json!([]), "{:?}", view.state);
    let failures = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = failures.clone();
    api.fault(move |r| {
        (r.verb == "watch" && r.resource == "pods").then(|| {
            let message = match seen.fetch_add(1, Ordering::SeqCst) {
                0 => "the first failure",
                _ => "the second failure",
            };
            crate::support::kube_api::Fault::Status(503, message.into())
        })
    });
    api.drop_watches();
    let pod_error = |view: &View| {
        view.state["errors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "Pod")
            .map(|e| e["message"].as_str().unwrap().to_owned())
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pod_error(&view).is_some_and(|m| m.contains("the second failure")) {
        assert!(
            Instant::now() < deadline,
            "never told the second failure ({} sent): {:?}",
            failures.load(Ordering::SeqCst),
            view.state["errors"]
        );
        if let Some(Received::Message(m)) = client.receive_within(Duration::from_secs(1)).await {
            view.apply(update_of(&m["payload"]));
        }
    }
    assert!(
        view.resources.values().any(|r| r["kind"] == "Pod"),
        "the Pods are kept"
    );
}

/// How an agent reached through GitLab's agent server goes away while its watches stream.
#[derive(Clone, Copy)]
enum Away {
    /// envlens' token is revoked at GitLab, then rotated in its file.
    TokenRevoked,
    /// agentk disconnects from KAS, then connects again.
    AgentGone,
}

/// envlens' token revoked while the watches stream (SPEC 14): when they next reach KAS they
/// are refused, and the subscriber is told so as 503s naming the agent (never a 401) while it
/// keeps what it had; a new token written to the token file is tried by the circuit's next
/// probe, and the watches resume from their versions: the change made meanwhile arrives,
/// nothing lost and nothing listed again.
#[tokio::test]
async fn through_kas_a_token_revoked_mid_watch_then_rotated_loses_nothing() {
    away_and_back(Away::TokenRevoked).await;
}

/// The same when the agent disconnects and comes back: its streams break off with the
/// tunnel, the subscriber is told the agent is not connected, and nothing is lost.
#[tokio::test]
async fn through_kas_an_agent_that_leaves_and_comes_back_loses_nothing() {
    away_and_back(Away::AgentGone).await;
}

async fn away_and_back(away: Away) {
    const ROTATED: &str = "glpat-envlens-kas-rotated-9876543210";
    let (api, served, _dir) = cluster().await;
    // The viewer's access reviews, asked at the first view, are reused for a minute: what the
    // viewer is shown while the agent is away is the cache's, not a refusal of reviews that
    // cannot be asked then (a decision older than `access_cache` fails closed, and a first
    // view on a loaded machine can take most of the default 5 s).
    let server = start_with(
        Reach::Kas,
        &served,
        "  access_cache: 60s\n",
        SocketLimits::default(),
    )
    .await;
    let through = server.reached.kas.as_ref().unwrap();
    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    client
        .subscribe("g", &group_subscription(), json!({"id": PRODUCTION}))
        .await;
    let mut view = View::default();
    view.apply(update_of(&client.next_payload("g").await));
    assert_eq!(view.state["errors"], json!([]), "{:?}", view.state);
    let pod_lists = api.request_count("list", "pods");

    let said = match away {
        Away::TokenRevoked => {
            // Revoked at GitLab, KAS' 60 s of its last answer over, and the streams end (as
            // the API server's own timeout ends them): their resumptions reach KAS, which
            // refuses them.
            through.gitlab.kas.revoke(ENVLENS_TOKEN);
            through.kas.forget_decisions();
            api.drop_watches();
            "agent 7: envlens' token refused"
        }
        Away::AgentGone => {
            through.kas.disconnect(7);
            "agent 7 is not connected"
        }
    };
    // Told: every kind's error a 503 naming why. A watch cut as the agent leaves may first
    // report the dropped connection; it is told what KAS says once it asks again.
    let told = |view: &View| {
        let errors = view.state["errors"].as_array().unwrap();
        !errors.is_empty()
            && errors
                .iter()
                .all(|e| e["code"] == 503 && e["message"].as_str().unwrap().contains(said))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !told(&view) {
        assert!(Instant::now() < deadline, "never told: {:?}", view.state);
        assert!(
            !view.resources.is_empty(),
            "what the cache held is kept: {:?}",
            view.state
        );
        if let Away::TokenRevoked = away {
            // The cache's watches start once the first view is over, as its message goes
            // out: one KAS let through before the revocation may reach the API server only
            // after the drop above (on a loaded machine, all of them did, and none of them
            // ended for a minute). Those open now end too; their resumptions are refused.
            api.drop_watches();
        }
        if let Some(Received::Message(m)) = client.receive_within(Duration::from_secs(1)).await {
            view.apply(update_of(&m["payload"]));
        }
    }
    assert!(
        !view.resources.is_empty(),
        "what the cache held is kept: {:?}",
        view.state
    );

    // Meanwhile a Pod fails; then the way in is back.
    pod_with_phase(&api, "web-new222-b", "Failed");
    match away {
        Away::TokenRevoked => {
            through
                .gitlab
                .kas
                .add_token(ROTATED, ENVLENS_USER.0, ENVLENS_USER.1, &["k8s_proxy"]);
            std::fs::write(&through.token_file, format!("{ROTATED}\n")).unwrap();
        }
        Away::AgentGone => through.kas.connect(7, &served),
    }
    let failed = |view: &View| {
        view.resources
            .values()
            .any(|r| r["name"] == "web-new222-b" && r["manifest"]["status"]["phase"] == "Failed")
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(failed(&view) && view.state["errors"] == json!([])) {
        assert!(Instant::now() < deadline, "never back: {:?}", view.state);
        if let Some(Received::Message(m)) = client.receive_within(Duration::from_secs(1)).await {
            view.apply(update_of(&m["payload"]));
        }
    }
    assert_eq!(view, View::of(&fresh(&server.app, DEV).await));
    assert_eq!(
        api.request_count("list", "pods"),
        pod_lists,
        "resumed, not listed"
    );
    if let Away::TokenRevoked = away {
        let rotated = format!("Bearer pat:7:{ROTATED}");
        assert!(through.kas.received().iter().any(|(_, _, headers)| headers
            .get("authorization")
            .is_some_and(|v| v == rotated.as_str())));
    }
}

async fn whole_group_then_a_changed_pod(api: &KubeApi, server: &Server) {
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        let mut client = Client::connect(server.addr, protocol, DEV).await;
        client
            .subscribe("1", &group_subscription(), json!({"id": PRODUCTION}))
            .await;
        let first = client.next_payload("1").await;
        let first = update_of(&first);
        assert_eq!(first["complete"], true);
        assert_eq!(first["removed"], json!([]));
        let mut view = View::default();
        view.apply(first);
        let expected = View::of(&fresh(&server.app, DEV).await);
        assert_eq!(view.names(), expected.names(), "{protocol}");
        assert_eq!(
            view, expected,
            "{protocol}: the first message is the whole group"
        );

        // One Pod changes at the test server: a message about that Pod (and the rollup).
        let phase = if protocol == "graphql-ws" {
            "Failed"
        } else {
            "Pending"
        };
        pod_with_phase(api, "web-new222-b", phase);
        let payload = client.next_payload("1").await;
        let update = update_of(&payload);
        assert_eq!(update["complete"], false);
        let upserted: Vec<&Value> = update["upserted"].as_array().unwrap().iter().collect();
        assert_eq!(upserted.len(), 1, "{update}");
        assert_eq!(upserted[0]["name"], "web-new222-b");
        assert_eq!(upserted[0]["manifest"]["status"]["phase"], phase);
        assert_eq!(update["removed"], json!([]));
        assert_eq!(update["edgesAdded"], json!([]));
        assert_eq!(update["edgesRemoved"], json!([]));
        view.apply(update);
        assert_eq!(view, View::of(&fresh(&server.app, DEV).await), "{protocol}");

        // The client ends the subscription; the server confirms (graphql-ws) or stays silent.
        let stop = if client.legacy { "stop" } else { "complete" };
        client.send(json!({"id": "1", "type": stop})).await;
    }
}

both_ways!(changes_within_100_ms_are_one_message);
async fn changes_within_100_ms_are_one_message(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let server = start(reach, &served).await;
    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    client
        .subscribe("g", &group_subscription(), json!({"id": PRODUCTION}))
        .await;
    let mut view = View::default();
    view.apply(update_of(&client.next_payload("g").await));
    // Twenty changes in quick succession: the first may go at once, the rest wait for the
    // window's end and go together.
    let started = Instant::now();
    for i in 0..20 {
        let mut pod = api.get("pods", Some(NS), "web-new222-a").unwrap();
        pod["metadata"]["annotations"] = json!({"step": i.to_string()});
        api.insert(pod);
    }
    let burst = started.elapsed();
    let mut messages = 0;
    while let Some(Received::Message(m)) = client.receive_within(Duration::from_millis(600)).await {
        view.apply(update_of(&m["payload"]));
        messages += 1;
    }
    assert!(
        burst < Duration::from_millis(100),
        "the burst took {burst:?}: the test cannot judge coalescing"
    );
    assert!(
        (1..=2).contains(&messages),
        "{messages} messages for 20 changes within {burst:?}"
    );
    assert_eq!(view, View::of(&fresh(&server.app, DEV).await));
    let pod = &view.resources["uid-pod-web-new222-a"];
    assert_eq!(pod["manifest"]["metadata"]["annotations"]["step"], "19");
}

/// Environment `staging` of acme/apps/web, in the same namespace as production (deployed by
/// the test that needs it).
const STAGING: &str = "gid://gitlab/Environment/103";

/// Messages until each of `ids` had one, each applied to its view.
async fn one_each(client: &mut Client, views: &mut BTreeMap<String, View>, ids: &[&str]) {
    let mut waiting: BTreeSet<&str> = ids.iter().copied().collect();
    while !waiting.is_empty() {
        let m = client.message().await;
        assert_eq!(m["type"], "next", "{m}");
        let id = m["id"].as_str().unwrap().to_owned();
        views
            .get_mut(&id)
            .unwrap_or_else(|| panic!("a message for {id}: {m}"))
            .apply(update_of(&m["payload"]));
        waiting.remove(id.as_str());
    }
}

const ASSEMBLIES: &str = "envlens_feed_assemblies_total";

/// The assemblies so far, once no more come for a second: the feeds' first reads start the
/// namespace's watches, whose first events (a kind's reset) may wake a feed after its first
/// message.
async fn quiet_assemblies(app: &TestApp) -> f64 {
    let mut last = app.metric(ASSEMBLIES).await;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = app.metric(ASSEMBLIES).await;
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Two environments in one namespace, each followed by its own feed: a change to one group's
/// Pod makes that feed assemble its group again, not the other's (which assembled it for
/// every change of the namespace); a change that moves an object into or out of a group (its
/// labels, an owner given, a deletion) still reaches every group it moves.
#[tokio::test]
async fn a_feed_assembles_its_group_again_only_for_changes_that_can_reach_it() {
    let (api, served, _dir) = cluster().await;
    let server = start(Reach::Kubeconfig, &served).await;
    environment::deploy(&server.app, 4, (103, "staging"), "success").await;
    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    let mut views: BTreeMap<String, View> = BTreeMap::new();
    for (id, environment) in [("p", PRODUCTION), ("s", STAGING)] {
        client
            .subscribe(id, &group_subscription(), json!({ "id": environment }))
            .await;
        views.insert(id.to_owned(), View::default());
    }
    one_each(&mut client, &mut views, &["p", "s"]).await;
    assert!(views["p"].resources.contains_key("uid-cm-web"));
    assert!(views["s"].resources.contains_key("uid-web-staging"));
    assert!(!views["s"].resources.contains_key("uid-debug"));

    // Production's Pod, six times: production's feed assembles six times, staging's never.
    let before = quiet_assemblies(&server.app).await;
    for i in 0..6 {
        let mut pod = api.get("pods", Some(NS), "web-new222-a").unwrap();
        pod["metadata"]["annotations"] = json!({"step": i.to_string()});
        api.insert(pod);
        one_each(&mut client, &mut views, &["p"]).await;
    }
    let pod = &views["p"].resources["uid-pod-web-new222-a"];
    assert_eq!(pod["manifest"]["metadata"]["annotations"]["step"], "5");
    assert_eq!(
        server.app.metric(ASSEMBLIES).await - before,
        6.0,
        "one assembly per change, by production's feed alone"
    );

    // Production's ConfigMap labelled staging's: out of one group, into the other.
    let before = quiet_assemblies(&server.app).await;
    let mut config = api.get("configmaps", Some(NS), "web-config").unwrap();
    config["metadata"]["labels"] = environment::gitlab_labels("staging", "web");
    api.insert(config);
    one_each(&mut client, &mut views, &["p", "s"]).await;
    assert!(!views["p"].resources.contains_key("uid-cm-web"));
    assert!(views["s"].resources.contains_key("uid-cm-web"));
    // A Pod of neither, given staging's Deployment as its owner: into staging's.
    let mut shell = api.get("pods", Some(NS), "debug-shell").unwrap();
    shell["metadata"]["ownerReferences"] =
        environment::owner_ref("apps/v1", "Deployment", "web-staging", "uid-web-staging");
    api.insert(shell);
    one_each(&mut client, &mut views, &["s"]).await;
    assert!(views["s"].resources.contains_key("uid-debug"));
    // Production's Pod deleted: out of production's.
    api.remove("pods", Some(NS), "web-new222-b").unwrap();
    one_each(&mut client, &mut views, &["p"]).await;
    assert!(!views["p"].resources.contains_key("uid-pod-web-new222-b"));
    assert_eq!(
        server.app.metric(ASSEMBLIES).await - before,
        4.0,
        "the relabelling reaches both feeds, the owner staging's, the deletion production's"
    );
    assert_eq!(views["p"], View::of(&fresh(&server.app, DEV).await));
}

#[tokio::test]
async fn connection_init_authenticates() {
    let (_api, served, _dir) = cluster().await;
    let server = start(Reach::Kubeconfig, &served).await;
    let addr = server.addr;
    let (token, csrf) = mint_session(SESSION_KEY, 2, "dev", Duration::from_secs(600)).unwrap();
    let cookie = format!("_gitlab_kas={token}");
    let unknown = bearer((99, "ghost"));
    let forged = format!("{}x", bearer(DEV));
    // (the session cookie sent with the upgrade, the payload, why it is refused)
    let refused: [(Option<&str>, Value, &str); 5] = [
        (None, json!({}), "not signed in"),
        (
            None,
            json!({"Authorization": forged}),
            "token signature does not match",
        ),
        (None, json!({"Authorization": unknown}), "unknown user"),
        (Some(&cookie), json!({}), "missing CSRF token"),
        (
            Some(&cookie),
            json!({"X-Csrf-Token": "wrong"}),
            "CSRF token does not match",
        ),
    ];
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        for (cookie, payload, why) in &refused {
            let headers: Vec<(&str, &str)> = cookie.iter().map(|c| ("cookie", *c)).collect();
            let mut client = open(addr, "", protocol, &headers).await.unwrap();
            client
                .send(json!({"type": "connection_init", "payload": payload}))
                .await;
            if client.legacy {
                // The older protocol answers `connection_error`, then closes.
                let m = client.message().await;
                assert_eq!(m["type"], "connection_error", "{m}");
                assert!(
                    m["payload"]["message"].as_str().unwrap().contains(why),
                    "{m}"
                );
            } else {
                let (code, reason) = client.closed().await;
                assert_eq!(code, 4403, "{why}: {reason}");
                assert!(reason.contains(why), "{why}: {reason}");
            }
        }
        // The cookie with its CSRF token: in the payload, or as the query parameter.
        for (query, payload) in [
            (String::new(), json!({"X-Csrf-Token": csrf})),
            (format!("?gitlab-csrf-token={csrf}"), json!({})),
        ] {
            let mut client = open(addr, &query, protocol, &[("cookie", &cookie)])
                .await
                .unwrap();
            client
                .send(json!({"type": "connection_init", "payload": payload}))
                .await;
            assert_eq!(client.message().await["type"], "connection_ack");
        }
    }
    // Before `connection_init`, a subscription closes the socket.
    let mut client = open(addr, "", "graphql-transport-ws", &[]).await.unwrap();
    client
        .subscribe("1", &group_subscription(), json!({"id": PRODUCTION}))
        .await;
    assert!(matches!(client.receive().await, Received::Closed(..)));
}

#[tokio::test]
async fn the_origin_is_checked_before_the_upgrade() {
    let (_api, served, _dir) = cluster().await;
    let server = start(Reach::Kubeconfig, &served).await;
    for origin in [
        "https://evil.example.com",
        "http://envlens.example.com",
        "null",
    ] {
        let (status, body) = open(
            server.addr,
            "",
            "graphql-transport-ws",
            &[("origin", origin)],
        )
        .await
        .err()
        .expect("refused");
        assert_eq!(status, 403, "{origin}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["errors"][0]["extensions"]["code"], "FORBIDDEN");
        assert!(
            body["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("origin `{origin}` are not allowed")),
            "{body}"
        );
    }
    // envlens' own origin, a CORS origin, and no Origin at all (no browser).
    for origin in [Some(PUBLIC_URL), Some("https://gitlab.example.com"), None] {
        let headers: Vec<(&str, &str)> = origin.iter().map(|o| ("origin", *o)).collect();
        assert!(
            open(server.addr, "", "graphql-transport-ws", &headers)
                .await
                .is_ok(),
            "{origin:?}"
        );
    }
    // A socket without one of the two subprotocols is refused.
    let (status, _) = open(server.addr, "", "chat", &[])
        .await
        .err()
        .expect("refused");
    assert_eq!(status, 400);
    // A GET that is no upgrade stays 405.
    let res = server
        .app
        .send(Request::get("/api/graphql").body(Body::empty()).unwrap())
        .await;
    assert_eq!(res.status, 405);
}

#[tokio::test]
async fn sockets_are_bounded() {
    let (_api, served, _dir) = cluster().await;
    let limits = SocketLimits {
        max_subscriptions: 1,
        max_connections: 2,
        init_timeout: Duration::from_millis(300),
        max_message_bytes: 4096,
        ..SocketLimits::default()
    };
    let server = start_with(Reach::Kubeconfig, &served, "", limits).await;
    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    client
        .subscribe("1", &group_subscription(), json!({"id": PRODUCTION}))
        .await;
    client
        .subscribe("2", &group_subscription(), json!({"id": PRODUCTION}))
        .await;
    // The second is refused by itself; the first carries on.
    let mut refused = None;
    let mut first = None;
    while refused.is_none() || first.is_none() {
        let m = client.message().await;
        match m["id"].as_str() {
            Some("2") => refused = Some(m),
            Some("1") => first = Some(m),
            _ => panic!("{m}"),
        }
    }
    let refused = refused.unwrap();
    assert_eq!(refused["type"], "error");
    assert_eq!(
        refused["payload"][0]["extensions"]["code"],
        "TOO_MANY_SUBSCRIPTIONS"
    );
    assert_eq!(first.unwrap()["type"], "next");

    // A connection that does not initialise in time is closed.
    let mut silent = open(server.addr, "", "graphql-transport-ws", &[])
        .await
        .unwrap();
    let (code, reason) = silent.closed().await;
    assert_eq!(
        (code, reason.as_str()),
        (4408, "Connection initialisation timeout")
    );
    drop(silent);

    // Two connections at most: a third is refused while two are open.
    let _second = open(server.addr, "", "graphql-transport-ws", &[])
        .await
        .unwrap();
    let mut third = None;
    for _ in 0..50 {
        match open(server.addr, "", "graphql-transport-ws", &[]).await {
            Err(refusal) => {
                third = Some(refusal);
                break;
            }
            // The closed one's slot may not be given back yet.
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let (status, body) = third.expect("a third connection is refused");
    assert_eq!(status, 503, "{body}");

    // A message over the bound closes the socket.
    let big = "x".repeat(8192);
    client
        .send(json!({"id": "3", "type": "subscribe", "payload": {"query": big}}))
        .await;
    let mut closed = false;
    for _ in 0..5 {
        if let Received::Closed(..) = client.receive().await {
            closed = true;
            break;
        }
    }
    assert!(closed, "an over-long message ends the connection");
}

both_ways!(a_burst_of_subscribes_is_answered_whole);
/// A burst of messages larger than what the server reads ahead is answered whole: the server
/// keeps answering while it hands the client's messages on (it once awaited a full queue while
/// its answers waited to be read, and the socket stopped for good).
async fn a_burst_of_subscribes_is_answered_whole(reach: Reach) {
    let (_api, served, _dir) = cluster().await;
    let server = start(reach, &served).await;
    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    // Pings first (each answered with a pong), well past the server's read-ahead, then as many
    // subscribes as one socket may hold.
    for _ in 0..40 {
        client.send(json!({"type": "ping"})).await;
    }
    const BURST: usize = 19;
    for i in 0..BURST {
        // Each is refused at once by validation: its errors, then its end.
        client
            .subscribe(&i.to_string(), "subscription { noSuchField }", json!({}))
            .await;
    }
    // Subscriptions run side by side: their answers come in any order.
    let (mut refused, mut completed) = (BTreeSet::new(), BTreeSet::new());
    for _ in 0..2 * BURST {
        let m = client.message().await;
        let id: usize = m["id"].as_str().unwrap().parse().unwrap();
        match m["type"].as_str() {
            Some("next") => {
                let code = &m["payload"]["errors"][0]["extensions"]["code"];
                assert_eq!(code, "GRAPHQL_VALIDATION_FAILED", "{m}");
                refused.insert(id);
            }
            Some("complete") => assert!(completed.insert(id), "{m}"),
            _ => panic!("{m}"),
        }
    }
    assert_eq!((refused.len(), completed.len()), (BURST, BURST));
}

#[tokio::test]
async fn idle_silent_and_left_behind_sockets_are_closed() {
    let (_api, served, _dir) = cluster().await;
    let idle = SocketLimits {
        idle_timeout: Duration::from_millis(300),
        ..SocketLimits::default()
    };
    let server = start_with(Reach::Kubeconfig, &served, "", idle).await;
    // Initialised, but nothing subscribed.
    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    let (code, reason) = client.closed().await;
    assert_eq!((code, reason.as_str()), (1000, "idle: no subscription"));
    // Subscribed: it stays, until the server shuts down and tells it to go (to reconnect
    // elsewhere).
    let mut subscribed = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    subscribed
        .subscribe("e", ENVIRONMENTS, json!({"project": "acme/apps/web"}))
        .await;
    assert!(subscribed
        .receive_within(Duration::from_millis(500))
        .await
        .is_none());
    let Server { _stop: stop, .. } = server;
    stop.send(()).unwrap();
    let (code, reason) = subscribed.closed().await;
    assert_eq!(
        (code, reason.as_str()),
        (1001, "the server is shutting down")
    );

    let pings = SocketLimits {
        ping_interval: Duration::from_millis(100),
        ..SocketLimits::default()
    };
    let server = start_with(Reach::Kubeconfig, &served, "", pings).await;
    // A client that reads (and so answers pings) stays.
    let mut alive = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    assert!(alive
        .receive_within(Duration::from_millis(500))
        .await
        .is_none());
    // One that answers nothing for two intervals is gone. It reads nothing (so answers no ping)
    // for far longer than the server's three intervals, so that a server slowed by a loaded
    // machine has decided before the client's first read answers the pings it holds.
    let mut silent = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    match silent.receive().await {
        Received::Closed(code, reason) => {
            assert_eq!((code, reason.as_str()), (1001, "no answer to pings"))
        }
        other => panic!("{other:?}"),
    }
}

both_ways!(the_subscription_ends_with_forbidden_once_user_access_is_gone);
async fn the_subscription_ends_with_forbidden_once_user_access_is_gone(reach: Reach) {
    let (_api, served, _dir) = cluster().await;
    let server = start_with(
        reach,
        &served,
        "  access_cache: 200ms\n",
        SocketLimits::default(),
    )
    .await;
    // A reporter has no `user_access`: refused at once, with the query's message.
    let mut reporter = Client::connect(server.addr, "graphql-transport-ws", REP).await;
    reporter
        .subscribe("r", &group_subscription(), json!({"id": PRODUCTION}))
        .await;
    let m = reporter.message().await;
    let error = if m["type"] == "error" {
        &m["payload"][0]
    } else {
        &m["payload"]["errors"][0]
    };
    assert_eq!(error["extensions"]["code"], "FORBIDDEN", "{m}");

    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    client
        .subscribe("1", &group_subscription(), json!({"id": PRODUCTION}))
        .await;
    assert_eq!(update_of(&client.next_payload("1").await)["complete"], true);
    // GitLab removes the developer from the project.
    let res = server
        .app
        .system_hook(
            &json!({"event_name": "user_remove_from_team", "project_id": 42,
            "project_path_with_namespace": "acme/apps/web", "user_id": 2, "user_username": "dev",
            "access_level": "Developer"}),
        )
        .await;
    assert!(res.status.is_success(), "{}", res.text());
    let payload = client.next_payload("1").await;
    assert_eq!(
        payload["errors"][0]["extensions"]["code"], "FORBIDDEN",
        "{payload}"
    );
    assert_eq!(payload["errors"][0]["message"], envlens_forbidden_message());
    let end = client.message().await;
    assert_eq!(end, json!({"type": "complete", "id": "1"}));
}

both_ways!(a_blocked_users_socket_is_closed_at_the_next_check);
/// A user GitLab blocks loses their open socket at the next `access_cache` check (SPEC 13),
/// not only their subscriptions: nothing more reaches them on it.
async fn a_blocked_users_socket_is_closed_at_the_next_check(reach: Reach) {
    let (_api, served, _dir) = cluster().await;
    let server = start_with(
        reach,
        &served,
        "  access_cache: 200ms\n",
        SocketLimits::default(),
    )
    .await;
    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    client
        .subscribe("1", &group_subscription(), json!({"id": PRODUCTION}))
        .await;
    assert_eq!(update_of(&client.next_payload("1").await)["complete"], true);
    let mut bystander = Client::connect(server.addr, "graphql-transport-ws", REP).await;
    let res = server
        .app
        .system_hook(
            &json!({"event_name": "user_failed_login", "user_id": 2, "username": "dev",
            "name": "dev", "email": "dev@example.com", "state": "blocked",
            "created_at": "2026-10-03T06:08:48Z", "updated_at": "2026-11-15T04:52:06Z"}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    // The subscription may say FORBIDDEN first; then the socket closes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let closed = loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match client.receive_within(left).await {
            Some(Received::Closed(code, reason)) => break (code, reason),
            Some(Received::Message(_)) => continue,
            None => panic!("the blocked user's socket is still open"),
        }
    };
    assert_eq!(closed.0, 4403, "{closed:?}");
    assert!(closed.1.contains("not active"), "{closed:?}");
    // Another user's socket stays.
    assert!(bystander
        .receive_within(Duration::from_millis(600))
        .await
        .is_none());
}

fn envlens_forbidden_message() -> &'static str {
    "You don't have access to an agent that deployed to this environment. Please contact agent \
     administrator if you are allowed in \"user_access\" in agent config file."
}

both_ways!(a_role_binding_removed_while_subscribed_turns_the_kind_into_a_403);
async fn a_role_binding_removed_while_subscribed_turns_the_kind_into_a_403(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    // The agent impersonates (`access_as: user`): developers of project 42 may see Pods,
    // Deployments, ReplicaSets and Events, nothing else.
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "workloads", "namespace": NS},
        "rules": [{"apiGroups": ["", "apps"], "resources": ["pods", "deployments", "replicasets", "events"], "verbs": ["list", "watch"]}]}));
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "pods-only", "namespace": NS},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]}),
    );
    for (name, role) in [("devs", "workloads"), ("devs-pods", "pods-only")] {
        api.insert(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "Group", "name": "gitlab:project_role:42:developer"}]}),
        );
    }
    api.enforce_rbac();
    let server = start_with(
        reach,
        &served,
        "  access_cache: 200ms\n",
        SocketLimits::default(),
    )
    .await;
    server.reached.admit_own_identity(&api);
    let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    client
        .subscribe("1", &group_subscription(), json!({"id": PRODUCTION}))
        .await;
    let mut view = View::default();
    view.apply(update_of(&client.next_payload("1").await));
    let kinds: BTreeSet<String> = view
        .resources
        .values()
        .map(|r| r["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds,
        ["Deployment", "Pod", "ReplicaSet"].map(String::from).into()
    );
    let errors = view.state["errors"].as_array().unwrap();
    assert!(errors
        .iter()
        .any(|e| e["kind"] == "Service" && e["code"] == 403));
    assert!(!errors.iter().any(|e| e["kind"] == "ReplicaSet"));

    // The binding to the workloads goes: Deployments and ReplicaSets become 403 entries and
    // leave the group, and with them the Pods they own (which another binding still grants:
    // without their owners nothing selects them).
    api.remove("rolebindings.rbac.authorization.k8s.io", Some(NS), "devs");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let payload = client.next_payload("1").await;
        view.apply(update_of(&payload));
        let errors = view.state["errors"].as_array().unwrap().clone();
        if errors
            .iter()
            .any(|e| e["kind"] == "ReplicaSet" && e["code"] == 403)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no 403 for ReplicaSets: {errors:?}"
        );
    }
    let kinds: BTreeSet<String> = view
        .resources
        .values()
        .map(|r| r["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, BTreeSet::new());
    let errors = view.state["errors"].as_array().unwrap();
    assert!(errors
        .iter()
        .any(|e| e["kind"] == "Deployment" && e["code"] == 403));
    assert!(!errors.iter().any(|e| e["kind"] == "Pod"), "{errors:?}");
    assert_eq!(view, View::of(&fresh(&server.app, DEV).await));
}

/// One random change at the test server, or to the watches' connection to it.
fn random_step(api: &KubeApi, rng: &mut rand::rngs::StdRng, step: usize) -> String {
    use rand::Rng;
    let app = ["a", "b"][rng.random_range(0..2)];
    let pod = ["p1", "p2", "p3"][rng.random_range(0..3)];
    let slug = if rng.random_bool(0.8) {
        environment::SLUG
    } else {
        "staging"
    };
    match rng.random_range(0..9) {
        0 => {
            api.insert(environment::deployment(
                NS,
                app,
                &format!("uid-dep-{app}"),
                slug,
            ));
            format!("deployment {app} ({slug})")
        }
        1 => {
            environment::replica_set(api, NS, (app, &format!("uid-dep-{app}")), "h1", &[pod]);
            format!("replica set {app}-h1 with pod {pod}")
        }
        2 => format!(
            "delete deployment {app} ({})",
            api.remove("deployments.apps", Some(NS), app).is_some()
        ),
        3 => {
            let name = format!("{app}-h1-{pod}");
            format!(
                "delete pod {name} ({})",
                api.remove("pods", Some(NS), &name).is_some()
            )
        }
        4 | 5 => {
            let name = format!("{app}-h1-{pod}");
            match api.get("pods", Some(NS), &name) {
                Some(mut p) => {
                    let phase = ["Running", "Pending", "Failed"][rng.random_range(0..3)];
                    p["status"] = json!({"phase": phase});
                    api.insert(p);
                    format!("pod {name} {phase}")
                }
                None => format!("no pod {name}"),
            }
        }
        6 => {
            api.insert(json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": format!("ev-{step}"), "namespace": NS},
                "involvedObject": {"uid": format!("uid-dep-{app}")},
                "type": "Normal", "reason": "Scaled", "message": format!("step {step}"),
                "count": 1, "lastTimestamp": format!("2026-01-01T00:{:02}:00Z", step % 60)}));
            format!("event about {app}")
        }
        7 => {
            api.drop_watches();
            "dropped watches".into()
        }
        _ => {
            api.compact();
            "compacted (expired versions)".into()
        }
    }
}

both_ways!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    the_messages_applied_in_order_equal_a_fresh_answer
);
/// After any sequence of creates, updates, deletes, dropped streams and expired versions, the
/// first message with every later one applied in order equals a fresh `resourceGroup`.
/// Seeds are fixed so that a failure can be replayed; `SUBSCRIPTION_SEED` runs one more.
async fn the_messages_applied_in_order_equal_a_fresh_answer(reach: Reach) {
    use rand::SeedableRng;
    let (api, served, _dir) = cluster().await;
    let server = start(reach, &served).await;
    let mut seeds = vec![11u64, 12];
    if let Some(seed) = std::env::var("SUBSCRIPTION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        seeds.push(seed);
    }
    for seed in seeds {
        let mut client = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
        client
            .subscribe("p", &group_subscription(), json!({"id": PRODUCTION}))
            .await;
        let mut view = View::default();
        view.apply(update_of(&client.next_payload("p").await));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut done = Vec::new();
        for round in 0..8 {
            for _ in 0..rand::Rng::random_range(&mut rng, 1..6) {
                let step = done.len();
                done.push(random_step(&api, &mut rng, step));
            }
            // The messages catch up with the cluster: apply them until the view equals a
            // fresh answer (within 10 s).
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let expected = View::of(&fresh(&server.app, DEV).await);
                if view == expected {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "seed {seed} round {round} after {done:?}:\nview: {:?}\nfresh: {:?}",
                    view.names(),
                    expected.names()
                );
                if let Some(Received::Message(m)) =
                    client.receive_within(Duration::from_millis(200)).await
                {
                    assert_eq!(m["id"], "p", "{m}");
                    view.apply(update_of(&m["payload"]));
                }
            }
        }
        client.send(json!({"id": "p", "type": "complete"})).await;
    }
}

const ENVIRONMENTS: &str = "subscription($group: ID, $project: ID, $tier: DeploymentTier) {
    environmentsUpdated(groupPath: $group, projectPath: $project, tier: $tier) {
      id name tier lastDeployment(status: CREATED) { id status } resourceGroup { health } } }";

/// The environment [`until_listening`] writes to (`acme/apps/web`, tier production).
const PROBE: (i64, &str) = (101, "probe");

/// Waits (generously) until each `(client, subscription)` hears of what is written from now
/// on: a subscription is set up asynchronously after its message, and one set up after a
/// write never hears of it (it starts from what it reads then). A deployment of [`PROBE`]
/// that stays `created` is written again until each has heard of one.
async fn until_listening(app: &TestApp, subscribers: &mut [(&mut Client, &str)]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut heard = vec![false; subscribers.len()];
    for id in 900.. {
        environment::create(app, id, PROBE, "created", ("acme/agents:prod", NS)).await;
        for ((client, subscription), heard) in subscribers.iter_mut().zip(&mut heard) {
            if !*heard {
                if let Some(Received::Message(m)) =
                    client.receive_within(Duration::from_secs(1)).await
                {
                    assert_eq!(m["id"], *subscription, "{m}");
                    *heard = true;
                }
            }
        }
        if heard.iter().all(|h| *h) {
            return;
        }
        assert!(Instant::now() < deadline, "never listening: {heard:?}");
    }
}

/// The next `environmentsUpdated` of subscription `id` about `production`, those about
/// [`PROBE`] (from [`until_listening`], however late) skipped.
async fn production_update(client: &mut Client, id: &str) -> Value {
    loop {
        let payload = client.next_payload(id).await;
        assert!(payload.get("errors").is_none(), "{payload}");
        let env = &payload["data"]["environmentsUpdated"];
        if env["name"] != PROBE.1 {
            assert_eq!(env["id"], PRODUCTION, "{payload}");
            return env.clone();
        }
    }
}

/// Two servers on one database, each with its own pool: a deployment recorded through one
/// reaches the subscribers of the other (PostgreSQL LISTEN/NOTIFY), filtered by what each
/// subscriber asked for and may read.
#[tokio::test]
async fn environments_updated_reaches_subscribers_of_another_server() {
    let (api, served, _dir) = cluster().await;
    let one = start(Reach::Kubeconfig, &served).await;
    // The second server: another pool on the same database.
    let options = one.app.db.connect_options().as_ref().clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(5)
        .connect_with(options)
        .await
        .unwrap();
    let (addr, _stop) = listen(state(&one.reached, "", pool).await).await;

    let mut by_group = Client::connect(addr, "graphql-transport-ws", DEV).await;
    by_group
        .subscribe(
            "g",
            ENVIRONMENTS,
            json!({"group": "acme", "tier": "PRODUCTION"}),
        )
        .await;
    let mut other_project = Client::connect(addr, "graphql-ws", DEV).await;
    other_project
        .subscribe("o", ENVIRONMENTS, json!({"project": "acme/agents"}))
        .await;
    let mut admin = Client::connect(addr, "graphql-transport-ws", (1, "root")).await;
    admin
        .subscribe("a", ENVIRONMENTS, json!({"project": "acme/apps/web"}))
        .await;
    // Somebody who may not read acme/apps/web (private) hears nothing of it.
    let res = one
        .app
        .internal(
            axum::http::Method::PUT,
            "/api/v4/internal/identity",
            &json!({
            "groups": [], "projects": [], "members": [],
            "users": [{"id": 4, "username": "eve", "admin": false}]}),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let mut stranger = Client::connect(addr, "graphql-transport-ws", (4, "eve")).await;
    stranger.subscribe("s", ENVIRONMENTS, json!({})).await;
    until_listening(&one.app, &mut [(&mut by_group, "g"), (&mut admin, "a")]).await;

    // Recorded through the first server: a new deployment to `production`.
    environment::deploy(&one.app, 4, (100, "production"), "running").await;
    let env = production_update(&mut by_group, "g").await;
    assert_eq!(env["name"], "production");
    assert_eq!(env["tier"], "PRODUCTION");
    // The status hook came last: the environment as it is after it arrives (the creation
    // may arrive first, as its own message, however late the hook's follows).
    let mut latest = env;
    while latest["lastDeployment"] != Value::Null {
        assert_eq!(
            latest["lastDeployment"],
            json!({"id": "gid://gitlab/Deployment/4", "status": "CREATED"}),
            "before the status hook: {latest}"
        );
        latest = production_update(&mut by_group, "g").await;
    }
    // The admin reads everything: they hear of it too.
    let env = production_update(&mut admin, "a").await;
    assert_eq!(env["name"], "production");
    // Another project's subscriber hears nothing, nor does a user who may not read it.
    for (client, who) in [(&mut other_project, "acme/agents"), (&mut stranger, "eve")] {
        let heard = client.receive_within(Duration::from_millis(300)).await;
        assert!(heard.is_none(), "{who}: {heard:?}");
    }

    // A deployment that stays `created` shows as the environment's last created one.
    let res = one.app.internal(axum::http::Method::POST, "/api/v4/internal/deployments", &json!({
        "deployment": {"id": 5, "iid": 5, "status": "created", "ref": "main", "sha": "abc", "tag": false,
                       "created_at": "2026-11-21T10:00:00Z"},
        "project": {"id": 42, "full_path": "acme/apps/web"},
        "environment": {"id": 100, "name": "production", "slug": "production", "tier": "production"},
        "job": {"id": 5, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": "acme/agents:prod", "namespace": NS}
    })).await;
    assert_eq!(res.status, 201, "{}", res.text());
    // What was sent of deployment 4 before (its status, the health kept of its group) may
    // still be on its way: none of it has a deployment still CREATED.
    let env = loop {
        let env = production_update(&mut by_group, "g").await;
        if env["lastDeployment"] != Value::Null {
            break env;
        }
    };
    assert_eq!(
        env["lastDeployment"],
        json!({"id": "gid://gitlab/Deployment/5", "status": "CREATED"})
    );

    // The group's health changes at the cluster: the environment is sent again, with it.
    // Its Pods have no phase yet (UNKNOWN, the worst): once they all have succeeded, the
    // rollup is the next worst (the Deployment's rollout, PROGRESSING).
    assert_eq!(env["resourceGroup"]["health"], "UNKNOWN");
    for pod in [
        "web-old111-a",
        "web-new222-a",
        "web-new222-b",
        "nightly-2871-q9",
    ] {
        pod_with_phase(&api, pod, "Succeeded");
    }
    // Each Pod's change may be its own health change (the message names the Pods left):
    // UNKNOWN until the last.
    let env = loop {
        let env = production_update(&mut by_group, "g").await;
        if env["resourceGroup"]["health"] != "UNKNOWN" {
            break env;
        }
    };
    assert_eq!(env["resourceGroup"]["health"], "PROGRESSING", "{env}");
    for (client, who) in [(&mut other_project, "acme/agents"), (&mut stranger, "eve")] {
        let heard = client.receive_within(Duration::from_millis(300)).await;
        assert!(heard.is_none(), "{who}: {heard:?}");
    }
}

/// While the listening connection is down, PostgreSQL drops what is notified: once it listens
/// again, every `environmentsUpdated` subscription reads its scope again and sends what changed
/// since, and nothing else. The database refuses new connections meanwhile, so the write below
/// lands while nobody listens unless the listener finds an idle pooled connection at once.
#[tokio::test]
async fn environments_updated_catches_up_after_the_listener_reconnects() {
    let (_api, served, _dir) = cluster().await;
    let server = start(Reach::Kubeconfig, &served).await;
    let mut web = Client::connect(server.addr, "graphql-transport-ws", DEV).await;
    web.subscribe("w", ENVIRONMENTS, json!({"project": "acme/apps/web"}))
        .await;
    let mut all = Client::connect(server.addr, "graphql-transport-ws", (1, "root")).await;
    all.subscribe("a", ENVIRONMENTS, json!({})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The statements below from another database: one's own cannot be closed to connections.
    let options = server.app.db.connect_options().as_ref().clone();
    let database = options.get_database().unwrap().to_owned();
    let mut admin: sqlx::PgConnection =
        sqlx::ConnectOptions::connect(&options.database("postgres"))
            .await
            .unwrap();
    let allow = |yes: bool| format!("ALTER DATABASE \"{database}\" WITH ALLOW_CONNECTIONS {yes}");
    // Idle pooled connections enough for the listener to take one back and the write below
    // another: the database opens none while it is closed (else the write is refused, 500).
    let db = &server.app.db;
    let held = tokio::join!(db.acquire(), db.acquire(), db.acquire());
    drop((held.0.unwrap(), held.1.unwrap(), held.2.unwrap()));
    sqlx::query(&allow(false))
        .execute(&mut admin)
        .await
        .unwrap();
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = $1 AND query LIKE 'LISTEN %'",
    )
    .bind(&database)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(terminated, vec![true], "one listening connection");
    // Written through the server while nobody listens (on the pool's open connections): a
    // deployment that stays `created`.
    let res = server.app.internal(axum::http::Method::POST, "/api/v4/internal/deployments", &json!({
        "deployment": {"id": 4, "iid": 4, "status": "created", "ref": "main", "sha": "abc", "tag": false,
                       "created_at": "2026-11-21T10:00:00Z"},
        "project": {"id": 42, "full_path": "acme/apps/web"},
        "environment": {"id": 100, "name": "production", "slug": "production", "tier": "production"},
        "job": {"id": 4, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": "acme/agents:prod", "namespace": NS}
    })).await;
    assert_eq!(res.status, 201, "{}", res.text());
    // The write is queued; this process' relay drains it into a NOTIFY that nobody hears,
    // unless the listener found an idle pooled connection already open and listens again
    // (then the write arrives as any notice does, before the database reopens).
    let early = match web.receive_within(Duration::from_millis(500)).await {
        Some(Received::Message(m)) => {
            assert_eq!(
                (m["type"].as_str(), m["id"].as_str()),
                (Some("next"), Some("w")),
                "{m}"
            );
            Some(m["payload"].clone())
        }
        None => None,
        Some(other) => panic!("{other:?}"),
    };

    sqlx::query(&allow(true)).execute(&mut admin).await.unwrap();
    let payload = match early {
        Some(payload) => payload,
        None => web.next_payload("w").await,
    };
    assert!(payload.get("errors").is_none(), "{payload}");
    assert_eq!(payload["data"]["environmentsUpdated"]["id"], PRODUCTION);
    assert_eq!(
        payload["data"]["environmentsUpdated"]["lastDeployment"],
        json!({"id": "gid://gitlab/Deployment/4", "status": "CREATED"})
    );
    let payload = all.next_payload("a").await;
    assert_eq!(payload["data"]["environmentsUpdated"]["id"], PRODUCTION);
    // The other environments of the scope (review, canary) did not change: not sent again.
    // (Production may be: its group's health is recorded once read, SPEC 18.)
    for (client, who) in [(&mut web, "acme/apps/web"), (&mut all, "everything")] {
        while let Some(heard) = client.receive_within(Duration::from_millis(500)).await {
            let Received::Message(m) = &heard else {
                panic!("{who}: {heard:?}");
            };
            assert_eq!(
                m["payload"]["data"]["environmentsUpdated"]["id"], PRODUCTION,
                "{who}: {heard:?}"
            );
        }
    }
    // And the feed goes on as before.
    environment::deploy(&server.app, 5, (100, "production"), "success").await;
    let payload = web.next_payload("w").await;
    assert_eq!(payload["data"]["environmentsUpdated"]["id"], PRODUCTION);
}

impl Client {
    /// The raw text of the next message, pings skipped.
    async fn text(&mut self) -> String {
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(10), self.ws.next())
                .await
                .expect("a message within 10 s");
            if let Some(Ok(Message::Text(text))) = frame {
                if !text.contains(r#""type":"ping""#) && !text.contains(r#""type":"ka""#) {
                    return text.to_string();
                }
            }
        }
    }
}

both_ways!(shared_messages_are_the_resolved_ones_byte_for_byte);
/// A plain selection's messages are rendered once per feed message and selection and shared
/// by the subscribers (`graphql::splice`); byte for byte they are what async-graphql resolves
/// for the same selection inside an inline fragment (which no shared text serves), in both
/// protocols, the whole group and a change alike (frames cut from shared bytes: the unit tests
/// of `socket::frames`).
async fn shared_messages_are_the_resolved_ones_byte_for_byte(reach: Reach) {
    let (api, served, _dir) = cluster().await;
    let server = start(reach, &served).await;
    let plain = group_subscription();
    let aliased =
        "subscription($id: ID!) { resourceGroupUpdated(environmentId: $id) { c: complete health
            upserted { id: uid name manifest } edgesAdded { type from } errors { kind code } } }"
            .to_owned();
    let mut step = 0;
    for protocol in ["graphql-transport-ws", "graphql-ws"] {
        for query in [&plain, &aliased] {
            let resolved = query
                .replacen(
                    "(environmentId: $id) {",
                    "(environmentId: $id) { ... on ResourceGroupUpdate {",
                    1,
                )
                .replacen("} } }", "} } } }", 1);
            assert_ne!(&resolved, query);
            let mut clients = Vec::new();
            for q in [query, query, &resolved] {
                let mut client = Client::connect(server.addr, protocol, DEV).await;
                client.subscribe("1", q, json!({"id": PRODUCTION})).await;
                clients.push(client);
            }
            let mut firsts = Vec::new();
            for client in &mut clients {
                firsts.push(client.text().await);
            }
            assert!(
                firsts[0].contains(r#""resourceGroupUpdated":{"#),
                "{}",
                &firsts[0][..200]
            );
            assert!(!firsts[0].contains("envlens.splice."));
            assert_eq!(firsts[0], firsts[1], "{protocol}");
            assert_eq!(firsts[0], firsts[2], "{protocol}: the resolved message");

            step += 1;
            pod_with_phase(
                &api,
                "web-new222-b",
                ["Pending", "Failed", "Running"][step % 3],
            );
            let mut changes = Vec::new();
            for client in &mut clients {
                changes.push(client.text().await);
            }
            assert!(changes[0].contains("web-new222-b"), "{}", changes[0]);
            assert!(!changes[0].contains("envlens.splice."));
            assert_eq!(changes[0], changes[1], "{protocol}");
            assert_eq!(changes[0], changes[2], "{protocol}: the resolved change");
        }
    }
}

/// The errors that refused subscription `id` (a result with errors only), skipping other
/// messages (within 10 s).
async fn refusal_of(client: &mut Client, id: &str) -> Value {
    loop {
        let m = client.message().await;
        if m["id"] == id {
            assert!(matches!(m["type"].as_str(), Some("next" | "data")), "{m}");
            assert!(m["payload"]["data"].is_null(), "{m}");
            // Then the subscription ends.
            let end = client.message().await;
            assert_eq!(end["id"], id, "{end}");
            assert_eq!(end["type"], "complete", "{end}");
            return m["payload"]["errors"].clone();
        }
    }
}

/// Subscription slots `user` holds in the database, on every server.
async fn slots_of(db: &sqlx::PgPool, user: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM user_slots WHERE user_id = $1 AND kind = 'subscription'",
    )
    .bind(user)
    .fetch_one(db)
    .await
    .unwrap()
}

/// Waits until `user` holds `n` subscription slots.
async fn until_slots(db: &sqlx::PgPool, user: i64, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while slots_of(db, user).await != n {
        assert!(
            Instant::now() < deadline,
            "{} slots, not {n}",
            slots_of(db, user).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SPEC 13: at most 100 subscriptions per user, over all their sockets on every server.
#[tokio::test]
async fn a_users_hundred_and_first_subscription_is_refused_across_sockets_and_servers() {
    let (_api, served, _dir) = cluster().await;
    // Sockets that would each take many more: the bound is the person's.
    let wide = SocketLimits {
        max_subscriptions: 500,
        ..SocketLimits::default()
    };
    let one = start_with(Reach::Kubeconfig, &served, "", wide).await;
    let options = one.app.db.connect_options().as_ref().clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(5)
        .connect_with(options)
        .await
        .unwrap();
    let (other, _stop) = listen(state(&one.reached, "", pool).await.with_socket_limits(wide)).await;
    // The test's own look at the database, apart from both servers' pools.
    let options = one.app.db.connect_options().as_ref().clone();
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let web = json!({"project": "acme/apps/web"});
    let mut a = Client::connect(one.addr, "graphql-transport-ws", DEV).await;
    let mut b = Client::connect(one.addr, "graphql-ws", DEV).await;
    let mut c = Client::connect(other, "graphql-transport-ws", DEV).await;
    // Ten at a time, each ten running before the next are sent.
    let mut taken = 0;
    for (client, name, n) in [(&mut a, "a", 40), (&mut b, "b", 40), (&mut c, "c", 20)] {
        for i in 0..n {
            client
                .subscribe(&format!("{name}{i}"), ENVIRONMENTS, web.clone())
                .await;
            taken += 1;
            if taken % 10 == 0 {
                until_slots(&db, DEV.0, taken).await;
            }
        }
    }
    for (client, name) in [(&mut c, "c-more"), (&mut a, "a-more")] {
        client.subscribe(name, ENVIRONMENTS, web.clone()).await;
        let payload = refusal_of(client, name).await;
        assert_eq!(
            payload[0]["extensions"]["code"], "TOO_MANY_SUBSCRIPTIONS",
            "{payload}"
        );
    }
    assert_eq!(slots_of(&db, DEV.0).await, 100);
    // Another user subscribes as before.
    let mut rep = Client::connect(other, "graphql-transport-ws", REP).await;
    rep.subscribe("r", ENVIRONMENTS, web.clone()).await;
    until_slots(&db, REP.0, 1).await;
    assert!(rep
        .receive_within(Duration::from_millis(300))
        .await
        .is_none());
    // One completed on the first server gives a place on the second.
    a.send(json!({"id": "a0", "type": "complete"})).await;
    until_slots(&db, DEV.0, 99).await;
    c.subscribe("c-again", ENVIRONMENTS, web.clone()).await;
    until_slots(&db, DEV.0, 100).await;
    assert!(c.receive_within(Duration::from_millis(300)).await.is_none());
    // A socket that goes gives back its places.
    drop(b);
    until_slots(&db, DEV.0, 60).await;
}
