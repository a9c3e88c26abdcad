//! GitLab's watch API (SPEC 8.3) over a real socket: the token request and its checks, the
//! WebSocket's subprotocols and single-use tokens, several watches on one socket served from
//! the watch cache (a pod changed at the test server arrives), a kind RBAC refuses the user
//! as an error message, and watches the cache cannot serve passed to the cluster as the user.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::http::Method;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::proxy;
use crate::support::kube_api::{KubeApi, Served};
use crate::support::reach::{both_ways, Reach, Reached};
use crate::support::*;

pub struct Live {
    pub app: TestApp,
    pub addr: SocketAddr,
    pub api: KubeApi,
    _stop: tokio::sync::oneshot::Sender<()>,
    pub reached: Reached,
    pub served: Served,
    _dir: TempDir,
}

/// envlens on a socket, over the proxy tests' identity and agents and their cluster (pods
/// `web-1` and `web-2` in `apps`).
pub async fn live() -> Live {
    live_via(Reach::Kubeconfig).await
}

/// [`live`], its agents reached as `reach` says ([`proxy::reached`]).
pub async fn live_via(reach: Reach) -> Live {
    let (api, served, dir) = proxy::cluster().await;
    let reached = proxy::reached(reach, &served).await;
    let yaml = reached.config("  own_namespace: envlens\n", "");
    let settings = envlens::config::file::Settings::parse(&yaml).unwrap();
    let clusters = crate::support::clusters(&settings).await;
    let database = postgres::fresh_database().await;
    let state =
        envlens::state::AppState::new(database.clone(), keys(), envlens::config::Limits::default())
            .with_clusters(clusters, settings.cors);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(envlens::run(
        state.clone(),
        listener,
        async { stopped.await.unwrap_or(()) },
        Duration::from_secs(1),
    ));
    let app = TestApp::owning(state, database);
    proxy::populate(&app).await;
    Live {
        app,
        addr,
        api,
        _stop: stop,
        reached,
        served,
        _dir: dir,
    }
}

pub const TOKEN_PATH: &str = "/k8s-proxy/watch?kas-websocket-token-request=true";

impl Live {
    /// A watch token for `user` on `agent`, as the frontend asks for it.
    pub async fn token(&self, user: i64, agent: i64) -> String {
        let res = self
            .app
            .send(
                proxy::bearer(user, agent, Method::GET, TOKEN_PATH)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(res.status, 200, "{}", res.text());
        assert_eq!(res.headers["cache-control"], "no-store");
        res.json()["token"].as_str().unwrap().to_owned()
    }

    async fn open(
        &self,
        protocols: &[String],
    ) -> Result<(Socket, tungstenite::handshake::client::Response), tungstenite::Error> {
        let mut request = format!("ws://{}/k8s-proxy/watch", self.addr)
            .into_client_request()
            .unwrap();
        request.headers_mut().insert(
            "sec-websocket-protocol",
            protocols.join(", ").parse().unwrap(),
        );
        tokio_tungstenite::connect_async(request).await
    }

    /// A socket for `user` on `agent`, opened as the package opens it.
    pub async fn socket(&self, user: i64, agent: i64) -> Socket {
        let token = self.token(user, agent).await;
        self.open(&protocols(&token))
            .await
            .expect("the socket opens")
            .0
    }
}

pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub fn protocols(token: &str) -> Vec<String> {
    vec![
        "gitlab-agent-watch-api".into(),
        format!("websocket-token.kas.gitlab.com.{token}"),
    ]
}

pub async fn watch(ws: &mut Socket, id: &str, params: Value) {
    let message = json!({"type": "watch", "watch_id": id, "watch_params": params});
    ws.send(Message::text(message.to_string())).await.unwrap();
}

/// The next JSON message, within 5 s.
pub async fn next(ws: &mut Socket) -> Value {
    next_within(ws, Duration::from_secs(5)).await
}

/// The next JSON message, within `wait`.
async fn next_within(ws: &mut Socket, wait: Duration) -> Value {
    loop {
        let message = tokio::time::timeout(wait, ws.next())
            .await
            .unwrap_or_else(|_| panic!("a message within {wait:?}"))
            .expect("the socket stays open")
            .expect("a readable message");
        if let Message::Text(text) = message {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

/// The first `n` messages for `id`; messages for other watches wait in `kept` for their turn.
async fn collect(ws: &mut Socket, id: &str, n: usize) -> Vec<Value> {
    let mut mine = Vec::new();
    let mut kept = KEPT.with(|k| std::mem::take(&mut *k.borrow_mut()));
    kept.retain(|m: &Value| {
        if mine.len() < n && m["watchId"] == id {
            mine.push(m.clone());
            false
        } else {
            true
        }
    });
    while mine.len() < n {
        let m = next(ws).await;
        if m["watchId"] == id {
            mine.push(m);
        } else {
            kept.push(m);
        }
    }
    KEPT.with(|k| *k.borrow_mut() = kept);
    mine
}

thread_local! {
    /// Messages read for one watch while waiting for another's (tests run on one thread).
    static KEPT: std::cell::RefCell<Vec<Value>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `(event type, object name)` of data messages.
fn events(messages: &[Value]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = messages
        .iter()
        .map(|m| {
            assert_eq!(m["type"], "data", "{m}");
            (
                m["watchEvent"]["type"].as_str().unwrap().to_owned(),
                m["watchEvent"]["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

fn pair(t: &str, n: &str) -> (String, String) {
    (t.to_owned(), n.to_owned())
}

both_ways!(a_token_takes_the_proxys_checks_and_opens_one_socket);
async fn a_token_takes_the_proxys_checks_and_opens_one_socket(reach: Reach) {
    let live = live_via(reach).await;
    // No credentials, a user without user_access, an unknown agent: 401 as the proxy says it.
    let anonymous = live
        .app
        .send(
            axum::http::Request::get(TOKEN_PATH)
                .header("Gitlab-Agent-Id", "7")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.headers["gitlab-unauthorized"], "true");
    for (user, agent) in [(5, 7), (2, 99)] {
        let res = live
            .app
            .send(
                proxy::bearer(user, agent, Method::GET, TOKEN_PATH)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(res.status, 401, "{}", res.text());
        assert_eq!(res.json()["kind"], "Status");
    }

    let token = live.token(2, 7).await;
    // The socket must offer the watch API's subprotocol, and a token that was issued.
    let err = live
        .open(&[format!("websocket-token.kas.gitlab.com.{token}")])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, tungstenite::Error::Http(r) if r.status() == 400),
        "{err:?}"
    );
    let err = live.open(&protocols("made-up")).await.unwrap_err();
    assert!(
        matches!(&err, tungstenite::Error::Http(r) if r.status() == 401),
        "{err:?}"
    );
    let err = live
        .open(&["gitlab-agent-watch-api".to_owned()])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, tungstenite::Error::Http(r) if r.status() == 401),
        "{err:?}"
    );

    let (ws, response) = live.open(&protocols(&token)).await.unwrap();
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        "gitlab-agent-watch-api"
    );
    drop(ws);
    // Used once: a second socket with it is refused.
    let err = live.open(&protocols(&token)).await.unwrap_err();
    assert!(
        matches!(&err, tungstenite::Error::Http(r) if r.status() == 401),
        "{err:?}"
    );

    // Neither a token request nor a socket: a Status, not the cluster.
    let res = live
        .app
        .send(
            proxy::bearer(2, 7, Method::GET, "/k8s-proxy/watch")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 400, "{}", res.text());
    assert!(live
        .api
        .requests()
        .iter()
        .all(|r| !r.path.contains("watch")));
}

both_ways!(watches_share_a_socket_and_follow_the_cluster);
async fn watches_share_a_socket_and_follow_the_cluster(reach: Reach) {
    let live = live_via(reach).await;
    let mut ws = live.socket(2, 9).await;
    let pods = json!({"version": "v1", "resource": "pods", "namespace": "apps"});
    watch(&mut ws, "all-pods", pods.clone()).await;
    let mut one = pods.clone();
    one["field_selector"] = json!("metadata.name=web-1");
    one["label_selector"] = json!("app=web");
    watch(&mut ws, "web-1", one).await;

    let all = collect(&mut ws, "all-pods", 2).await;
    assert_eq!(
        events(&all),
        [pair("ADDED", "web-1"), pair("ADDED", "web-2")]
    );
    let object = &all[0]["watchEvent"]["object"];
    assert_eq!(object["apiVersion"], "v1");
    assert_eq!(object["kind"], "Pod");
    assert!(object["metadata"]["uid"].is_string());
    assert_eq!(object["spec"]["containers"][0]["image"], "nginx");
    let rest = collect(&mut ws, "web-1", 1).await;
    assert_eq!(events(&rest), [pair("ADDED", "web-1")]);

    // A change at the cluster reaches both watches that select the pod.
    let mut pod = live.api.get("pods", Some("apps"), "web-1").unwrap();
    pod["status"] = json!({"phase": "Running"});
    live.api.insert(pod);
    let a = collect(&mut ws, "all-pods", 1).await;
    let b = collect(&mut ws, "web-1", 1).await;
    assert_eq!(events(&a), [pair("MODIFIED", "web-1")]);
    assert_eq!(events(&b), [pair("MODIFIED", "web-1")]);
    assert_eq!(a[0]["watchEvent"]["object"]["status"]["phase"], "Running");

    // A pod created, then deleted.
    live.api.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-3", "namespace": "apps", "labels": {"app": "web"}}}));
    assert_eq!(
        events(&collect(&mut ws, "all-pods", 1).await),
        [pair("ADDED", "web-3")]
    );
    live.api.remove("pods", Some("apps"), "web-2");
    assert_eq!(
        events(&collect(&mut ws, "all-pods", 1).await),
        [pair("DELETED", "web-2")]
    );
    // Served from the cache: one list and one watch of pods, whatever the watchers.
    assert_eq!(live.api.request_count("list", "pods"), 1);
}

/// An agent that disconnects from KAS and comes back: the watch cache resumes from its version
/// through KAS, and what changed meanwhile reaches the socket (nothing lost).
#[tokio::test]
async fn a_watch_through_kas_resumes_when_the_agent_comes_back() {
    let live = live_via(Reach::Kas).await;
    let kas = &live.reached.kas.as_ref().unwrap().kas;
    let mut ws = live.socket(2, 9).await;
    let pods = json!({"version": "v1", "resource": "pods", "namespace": "apps"});
    watch(&mut ws, "all-pods", pods).await;
    assert_eq!(collect(&mut ws, "all-pods", 2).await.len(), 2);

    kas.disconnect(9);
    live.api.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "while-away", "namespace": "apps", "labels": {"app": "web"}}}));
    // Away for longer than KAS waits for an agent (1 s here): the watch broke off with the
    // tunnel and its resumptions fail meanwhile, so the change cannot arrive yet.
    let early = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(Message::Text(text))) = ws.next().await {
            if text.contains("while-away") {
                return text.to_string();
            }
        }
        String::new()
    })
    .await;
    assert!(
        early.is_err(),
        "arrived while the agent was away: {early:?}"
    );
    kas.connect(9, &live.served);
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let mut seen = Vec::new();
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "never arrived: {seen:?}"
        );
        let m = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
        let Ok(Some(Ok(Message::Text(text)))) = m else {
            continue;
        };
        let m: Value = serde_json::from_str(&text).unwrap();
        if m["watchEvent"]["object"]["metadata"]["name"] == "while-away" {
            assert_eq!(m["watchEvent"]["type"], "ADDED", "{m}");
            break;
        }
        seen.push(m);
    }
    // Resumed, not listed again from scratch: the old pods did not come back as ADDED.
    assert!(
        !seen.iter().any(|m| m["watchEvent"]["type"] == "ADDED"),
        "{seen:?}"
    );
}

both_ways!(secrets_of_envlens_namespace_are_refused_on_the_socket);
/// The proxy's refusals hold on the socket too (SPEC 13): envlens' own namespace's Secrets and
/// every namespace's are an error message, whatever the cluster (here: allowing all) says.
async fn secrets_of_envlens_namespace_are_refused_on_the_socket(reach: Reach) {
    let live = live_via(reach).await;
    let mut ws = live.socket(2, 9).await;
    for (id, namespace) in [("own", "envlens"), ("all", "")] {
        watch(
            &mut ws,
            id,
            json!({"version": "v1", "resource": "secrets", "namespace": namespace}),
        )
        .await;
        let m = next(&mut ws).await;
        assert_eq!(
            (&m["watchId"], &m["type"]),
            (&json!(id), &json!("error")),
            "{m}"
        );
        assert_eq!(m["error"]["object"]["code"], 403, "{m}");
        assert!(
            m["error"]["object"]["message"]
                .as_str()
                .unwrap()
                .contains("Secrets of"),
            "{m}"
        );
    }
    // Another namespace's Secrets are the cluster's to decide.
    live.api.insert(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "apps"}, "data": {"password": "aHVudGVyMg=="}}));
    watch(
        &mut ws,
        "apps",
        json!({"version": "v1", "resource": "secrets", "namespace": "apps"}),
    )
    .await;
    let m = next(&mut ws).await;
    assert_eq!(m["watchEvent"]["object"]["metadata"]["name"], "db", "{m}");
    assert!(!live
        .api
        .requests()
        .iter()
        .any(|r| r.path.contains("namespaces/envlens") || r.path == "/api/v1/secrets"));
}

/// [`live_via`] with RBAC enforced: every GitLab user may list and watch Pods in `apps`
/// (RoleBinding `users`), nothing else.
async fn pods_for_users_only(reach: Reach) -> Live {
    let live = live_via(reach).await;
    live.api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "pods", "namespace": "apps"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]}),
    );
    live.api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "users", "namespace": "apps"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
        "subjects": [{"kind": "Group", "name": "gitlab:user"}]}),
    );
    live.api.enforce_rbac();
    live.reached.admit_own_identity(&live.api);
    live
}

both_ways!(a_watch_whose_kind_is_taken_from_the_user_ends_with_a_refusal);
/// A running watch is judged again every `access_cache` (SPEC 8.1), not only when it starts:
/// the user's RoleBinding deleted, the open watch of Pods is refused and ends, and a Pod made
/// after that never reaches the socket.
async fn a_watch_whose_kind_is_taken_from_the_user_ends_with_a_refusal(reach: Reach) {
    let live = pods_for_users_only(reach).await;
    // Agent 7 impersonates the user.
    let mut ws = live.socket(2, 7).await;
    watch(
        &mut ws,
        "pods",
        json!({"version": "v1", "resource": "pods", "namespace": "apps"}),
    )
    .await;
    let pods = collect(&mut ws, "pods", 2).await;
    assert_eq!(
        events(&pods),
        [pair("ADDED", "web-1"), pair("ADDED", "web-2")]
    );
    live.api
        .remove("rolebindings", Some("apps"), "users")
        .expect("the binding");
    // Within a few access_cache periods (5 s here), the watch is refused: the only message.
    let refused = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(Ok(Message::Text(text))) = ws.next().await {
                return serde_json::from_str::<Value>(&text).unwrap();
            }
        }
    })
    .await
    .expect("the watch is refused");
    assert_eq!(
        (&refused["watchId"], &refused["type"]),
        (&json!("pods"), &json!("error")),
        "{refused}"
    );
    assert_eq!(refused["error"]["object"]["code"], 403, "{refused}");
    live.api.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "after", "namespace": "apps", "uid": "uid-after"}}));
    let more = tokio::time::timeout(Duration::from_secs(3), ws.next()).await;
    assert!(more.is_err(), "the refused watch went on: {more:?}");
}

both_ways!(a_kind_the_user_may_not_list_is_an_error_message);
async fn a_kind_the_user_may_not_list_is_an_error_message(reach: Reach) {
    let live = pods_for_users_only(reach).await;
    // Agent 7 impersonates the user.
    let mut ws = live.socket(2, 7).await;
    watch(
        &mut ws,
        "svc",
        json!({"version": "v1", "resource": "services", "namespace": "apps"}),
    )
    .await;
    let m = next(&mut ws).await;
    assert_eq!(m["watchId"], "svc");
    assert_eq!(m["type"], "error");
    assert_eq!(m["error"]["object"]["code"], 403);
    assert_eq!(
        m["error"]["object"]["message"],
        "services is forbidden: User \"gitlab:user:pdev\" cannot list resource \"services\" in API group \"\" in the namespace \"apps\""
    );
    watch(
        &mut ws,
        "pods",
        json!({"version": "v1", "resource": "pods", "namespace": "apps"}),
    )
    .await;
    let pods = collect(&mut ws, "pods", 2).await;
    assert_eq!(
        events(&pods),
        [pair("ADDED", "web-1"), pair("ADDED", "web-2")]
    );
    // All namespaces is the cluster's to decide, as the user: refused, and said so.
    watch(
        &mut ws,
        "everywhere",
        json!({"version": "v1", "resource": "pods"}),
    )
    .await;
    let m = collect(&mut ws, "everywhere", 1).await;
    assert_eq!(m[0]["type"], "error", "{}", m[0]);
    assert_eq!(m[0]["error"]["object"]["code"], 403);
    let listed = live
        .api
        .requests()
        .into_iter()
        .find(|r| r.path == "/api/v1/pods");
    match reach {
        Reach::Kubeconfig => {
            let asked = listed.expect("the cluster was asked");
            assert_eq!(asked.impersonate_user.as_deref(), Some("gitlab:user:pdev"));
        }
        // KAS cannot impersonate for envlens: a review for the user decides, and nothing is
        // listed (SPEC 14).
        Reach::Kas => {
            assert!(listed.is_none(), "{listed:?}");
            assert!(
                live.api
                    .review_counts()
                    .keys()
                    .any(|r| r.user == "gitlab:user:pdev"
                        && r.resource == "pods"
                        && r.namespace.is_empty()),
                "{:?}",
                live.api.review_counts()
            );
        }
    }
}

/// A watch of the cluster is read a line (an event) at a time: a line longer than any object
/// the API server keeps is an error and the watch's end, not a buffer that grows without end.
#[tokio::test]
async fn an_event_too_large_from_the_cluster_ends_the_watch_with_an_error() {
    let live = live().await;
    live.api.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "huge", "namespace": "other", "uid": "uid-huge",
                     "annotations": {"filler": "x".repeat(17 << 20)}}}));
    let mut ws = live.socket(2, 9).await;
    watch(
        &mut ws,
        "everywhere",
        json!({"version": "v1", "resource": "pods"}),
    )
    .await;
    // Before the error, the test server renders and sends the event's 17 MiB and envlens
    // reads them: more than a second of CPU alone, many on a loaded machine, where a small
    // event's 5 s (`next`) do not hold.
    let failed = loop {
        let m = next_within(&mut ws, Duration::from_secs(60)).await;
        assert_eq!(m["watchId"], "everywhere", "{m}");
        if m["type"] == "error" {
            break m;
        }
        assert_ne!(m["watchEvent"]["object"]["metadata"]["name"], "huge");
    };
    assert_eq!(failed["error"]["object"]["code"], 502, "{failed}");
    assert!(
        failed["error"]["object"]["message"]
            .as_str()
            .unwrap()
            .contains("over 16 MiB"),
        "{failed}"
    );
}

both_ways!(what_the_cache_cannot_serve_is_watched_at_the_cluster);
async fn what_the_cache_cannot_serve_is_watched_at_the_cluster(reach: Reach) {
    let live = live_via(reach).await;
    let mut ws = live.socket(2, 9).await;
    // All namespaces, and a selector only the API server evaluates.
    watch(
        &mut ws,
        "everywhere",
        json!({"version": "v1", "resource": "pods"}),
    )
    .await;
    watch(
        &mut ws,
        "not-web-2",
        json!({"version": "v1", "resource": "pods", "namespace": "apps", "label_selector": "app in (web)", "field_selector": "metadata.name!=web-2"}),
    )
    .await;
    let all = collect(&mut ws, "everywhere", 2).await;
    assert_eq!(
        events(&all),
        [pair("ADDED", "web-1"), pair("ADDED", "web-2")]
    );
    let some = collect(&mut ws, "not-web-2", 1).await;
    assert_eq!(events(&some), [pair("ADDED", "web-1")]);
    live.api.remove("pods", Some("apps"), "web-1");
    assert_eq!(
        events(&collect(&mut ws, "everywhere", 1).await),
        [pair("DELETED", "web-1")]
    );

    assert_eq!(
        events(&collect(&mut ws, "not-web-2", 1).await),
        [pair("DELETED", "web-1")]
    );

    // Bad messages are answered, and the socket goes on.
    ws.send(Message::text("{not json")).await.unwrap();
    assert_eq!(next(&mut ws).await["error"]["object"]["code"], 400);
    watch(
        &mut ws,
        "bad",
        json!({"version": "v1", "resource": "../secrets", "namespace": "apps"}),
    )
    .await;
    let m = next(&mut ws).await;
    assert_eq!(
        (m["watchId"].as_str(), m["error"]["object"]["code"].as_i64()),
        (Some("bad"), Some(400))
    );
    // A message past the bound closes the socket.
    ws.send(Message::text(
        "x".repeat(envlens::k8s::watch_api::MAX_MESSAGE + 1),
    ))
    .await
    .unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(m)) = ws.next().await {
            if matches!(m, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the socket is closed");
}

both_ways!(a_blocked_users_socket_is_closed_at_the_next_check);
/// A user GitLab blocks loses their open socket at the next `access_cache` check (SPEC 13).
async fn a_blocked_users_socket_is_closed_at_the_next_check(reach: Reach) {
    let live = live_via(reach).await;
    let mut ws = live.socket(2, 9).await;
    let hook = json!({"event_name": "user_failed_login", "created_at": "2026-10-03T06:08:48Z",
        "updated_at": "2026-11-15T04:52:06Z", "name": "pdev", "email": "pdev@example.com",
        "user_id": 2, "username": "pdev", "state": "blocked"});
    let res = live.app.system_hook(&hook).await;
    assert!(res.status.is_success(), "{}", res.text());
    // `access_cache` is 5 s here; a loaded machine gets room beyond it.
    let close = closed_within(&mut ws, Duration::from_secs(30)).await;
    assert_eq!(close, Some(1008));
}

/// The close code the server ends `ws` with, waited for `within` at most.
async fn closed_within(ws: &mut Socket, within: Duration) -> Option<u16> {
    tokio::time::timeout(within, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Ok(_)) => continue,
                _ => return None,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the socket is not closed within {within:?}"))
}

both_ways!(a_socket_whose_access_cannot_be_checked_is_closed);
/// Access fails closed: a socket whose `user_access` cannot be judged again (the statement
/// fails) keeps its last decision for a few checks, then is closed (1011), not kept open for
/// as long as the database cannot answer.
async fn a_socket_whose_access_cannot_be_checked_is_closed(reach: Reach) {
    let live = live_via(reach).await;
    let mut ws = live.socket(2, 9).await;
    sqlx::query("ALTER TABLE agent_user_access_authorizations RENAME TO user_access_gone")
        .execute(&live.app.db)
        .await
        .unwrap();
    // `access_cache` is 5 s here: three checks, and room for a loaded machine.
    let close = closed_within(&mut ws, Duration::from_secs(60)).await;
    assert_eq!(close, Some(1011));
}

both_ways!(watches_per_socket_are_bounded);
async fn watches_per_socket_are_bounded(reach: Reach) {
    let live = live_via(reach).await;
    let mut ws = live.socket(2, 9).await;
    let max = envlens::k8s::watch_api::MAX_WATCHES;
    for i in 0..=max {
        watch(&mut ws, &format!("w{i}"), json!({"version": "v1", "resource": "pods", "namespace": "apps", "field_selector": "metadata.name=none"}))
            .await;
    }
    let over = format!("w{max}");
    let m = collect(&mut ws, &over, 1).await;
    assert_eq!(m[0]["type"], "error");
    assert_eq!(m[0]["error"]["object"]["code"], 429);
}

both_ways!(a_users_twenty_first_socket_is_429_while_another_users_first_opens);
/// SPEC 13: at most 20 watch sockets per user; the 21st is refused before the upgrade, with
/// `Retry-After`, while another user opens theirs.
async fn a_users_twenty_first_socket_is_429_while_another_users_first_opens(reach: Reach) {
    let live = live_via(reach).await;
    let mut open = Vec::new();
    for _ in 0..20 {
        open.push(live.socket(2, 7).await);
    }
    let spent = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM watch_tokens_spent")
            .fetch_one(&live.app.db)
            .await
            .unwrap()
    };
    let spent_before = spent().await;
    let token = live.token(2, 7).await;
    match live.open(&protocols(&token)).await {
        Err(tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 429);
            // A socket refused records no spent token: the refusals cannot fill the table.
            assert_eq!(spent().await, spent_before);
            let retry: u64 = response.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(retry > 0);
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a 21st socket opened"),
    }
    let _theirs = live.socket(6, 7).await;
    // A socket closed gives its place back.
    let mut closed = open.pop().unwrap();
    closed.close(None).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let token = live.token(2, 7).await;
        match live.open(&protocols(&token)).await {
            Ok((ws, _)) => {
                open.push(ws);
                break;
            }
            Err(tungstenite::Error::Http(response)) if response.status() == 429 => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the place did not come back"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    // Places held by a replica that died (rows no longer renewed) count until their lease
    // runs out, then not.
    assert!(refused(&live).await, "20 open: the 21st is refused");
    sqlx::query("UPDATE user_slots SET expires_at = now() - interval '1 second' WHERE user_id = 2")
        .execute(&live.app.db)
        .await
        .unwrap();
    assert!(!refused(&live).await, "expired places do not count");
}

/// Whether a new socket of user 2 on agent 7 is refused for their count of sockets.
async fn refused(live: &Live) -> bool {
    let token = live.token(2, 7).await;
    let opened = live.open(&protocols(&token)).await;
    matches!(opened, Err(tungstenite::Error::Http(r)) if r.status() == 429)
}
