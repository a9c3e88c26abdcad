//! Views routed through the owner of a connection (SPEC 16): a `resourceGroup` asked of a
//! replica that does not own the agent's connection is answered by the owner, byte for byte
//! what the owner answers itself, without a list of the cluster by the replica asked; the
//! owner authenticates the viewer afresh and decides their `user_access` itself; an owner that
//! cannot be reached is said, and the group is listed by the replica asked.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::ownership::{kill_9, production, settled, world};
use super::Replica;
use crate::support::environment;
use crate::support::kube_api::KubeApi;
use crate::support::*;

/// Everything a resource group shows (causes aside, which read logs as the viewer).
const WHOLE_GROUP: &str = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
    resourceGroup { namespace namespaces labelSelector health healthMessage warnings
      errors { apiVersion kind code message }
      edges { from to type }
      resources { uid apiVersion kind namespace name labels createdAt
        health { status message }
        events { type reason message count firstSeen lastSeen source }
        manifest } } } } }"#;

/// The whole group as `user` (id, name) through `replica`: the answer's status and bytes.
fn whole_group(replica: &Replica, user: (i64, &str)) -> (u16, String) {
    let (token, _) =
        envlens::auth::mint_session(SESSION_KEY, user.0, user.1, Duration::from_secs(60)).unwrap();
    replica.post(
        "/api/graphql",
        &[("Authorization", &format!("Bearer {token}"))],
        &json!({ "query": WHOLE_GROUP }),
    )
}

fn lists(api: &KubeApi) -> u64 {
    api.request_counts()
        .iter()
        .filter(|((verb, _), _)| verb == "list")
        .map(|(_, n)| n)
        .sum()
}

/// Waits until the cluster has had no list for 2 s (whatever the replicas' own feeds read
/// when a group is first viewed there is over).
async fn lists_settled(api: &KubeApi) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut last, mut since) = (lists(api), Instant::now());
    while since.elapsed() < Duration::from_secs(2) {
        assert!(Instant::now() < deadline, "the lists never stop");
        tokio::time::sleep(Duration::from_millis(100)).await;
        if lists(api) != last {
            (last, since) = (lists(api), Instant::now());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_view_through_a_non_owner_is_the_owners_own_answer_byte_for_byte() {
    let world = world().await;
    let (api, setup) = (&world.api, &world.setup);
    let replicas = setup.replicas(3).await;
    let owner = setup.settled_owner(&replicas).await;
    production(owner);
    assert!(settled(api).await > 0, "the owner watches the namespace");
    let (status, owners) = whole_group(owner, (2, "dev"));
    assert_eq!(status, 200, "{owners}");
    let group: Value = serde_json::from_str(&owners).unwrap();
    let group = &group["data"]["project"]["environment"]["resourceGroup"];
    assert!(
        group["resources"].as_array().is_some_and(|r| r.len() > 3),
        "{owners}"
    );
    assert!(
        group["edges"].as_array().is_some_and(|e| !e.is_empty()),
        "{owners}"
    );
    // Each other replica's first view starts what it keeps of the group; then its views
    // list nothing: they are the owner's.
    let others: Vec<&Replica> = replicas.iter().filter(|r| r.id != owner.id).collect();
    for other in &others {
        whole_group(other, (2, "dev"));
    }
    lists_settled(api).await;
    api.reset_request_counts();
    for _ in 0..3 {
        for other in &others {
            let (status, body) = whole_group(other, (2, "dev"));
            assert_eq!(status, 200, "{body}");
            assert!(
                body == owners,
                "replica {} answered otherwise than the owner:\n{body}\nthe owner:\n{owners}\n{}",
                other.id,
                other.logs()
            );
        }
    }
    assert_eq!(
        lists(api),
        0,
        "the non-owners listed the cluster: {:?}",
        api.request_counts()
    );
    // The owner judges the viewer itself: one without user_access is refused there too.
    for other in &others {
        let (status, body) = whole_group(other, (3, "rep"));
        assert_eq!(status, 200, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            body["errors"][0]["extensions"]["code"], "FORBIDDEN",
            "{body}"
        );
    }
}

/// POSTs `body` to `path` of a replica's internal listener: the status and the body.
fn post_internal(
    advertise_url: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, String) {
    let host = advertise_url.strip_prefix("http://").unwrap();
    super::http(host, "POST", path, headers, Some(body))
}

/// A replica's token for a POST of `ask` to `path`.
fn signed(credential: Option<&str>, path: &str, ask: &Value) -> String {
    let request =
        envlens::auth::replica_request(&axum::http::Method::POST, path, ask.to_string().as_bytes());
    envlens::auth::mint_replica(INTERNAL_KEY, credential, &request).unwrap()
}

/// A replica's token carrying `user`'s bearer session as their credential, for a POST of
/// `ask` to `path`.
fn carrying(user: Option<(i64, &str)>, path: &str, ask: &Value) -> String {
    use axum::http::Request;
    let credential = user.map(|(id, name)| {
        let (token, _) =
            envlens::auth::mint_session(SESSION_KEY, id, name, Duration::from_secs(60)).unwrap();
        let request = Request::get("/")
            .header("authorization", format!("Bearer {token}"))
            .body(())
            .unwrap();
        envlens::auth::Credential::of(&request.into_parts().0).encode()
    });
    signed(credential.as_deref(), path, ask)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_owner_authenticates_the_viewer_and_decides_their_access_itself() {
    let world = world().await;
    let setup = &world.setup;
    let replicas = setup.replicas(1).await;
    let owner = setup.settled_owner(&replicas).await;
    let ask = json!({"agent": 7, "namespaces": [environment::NS],
                     "selector": envlens::resources::group::label_selector(environment::PROJECT, environment::SLUG)});
    let path = envlens::replicas::forward::RESOURCE_GROUP_PATH;
    let at = &owner.advertise_url;
    let header = envlens::auth::REPLICA_HEADER;

    let (status, body) = post_internal(
        at,
        path,
        &[(header, &carrying(Some((2, "dev")), path, &ask))],
        &ask,
    );
    assert_eq!(status, 200, "{body}");
    let group = envlens::replicas::wire::decode(body.as_bytes()).expect("a group");
    assert!(group.resources.len() > 3, "{body}");

    // Asked again with the tag of what it answered: judged again, then not sent again.
    let tag = envlens::replicas::memo::tag(body.as_bytes());
    let none_match = ("if-none-match", tag.as_str());
    let dev = carrying(Some((2, "dev")), path, &ask);
    let (status, unsent) = post_internal(at, path, &[(header, &dev), none_match], &ask);
    assert_eq!((status, unsent.as_str()), (304, ""));
    let rep = carrying(Some((3, "rep")), path, &ask);
    let (status, refused) = post_internal(at, path, &[(header, &rep), none_match], &ask);
    assert_eq!(status, 403, "{refused}");
    let stale = ("if-none-match", "\"00000000000000000000000000000000\"");
    let (status, again) = post_internal(at, path, &[(header, &dev), stale], &ask);
    assert_eq!((status, &again), (200, &body));

    // A token is good for the request it was signed for only: not with another ask (another
    // agent, more namespaces), nor at another route.
    let other = json!({"agent": 7, "namespaces": [environment::NS, "kube-system"],
                       "selector": ask["selector"]});
    let (status, body) = post_internal(
        at,
        path,
        &[(header, &carrying(Some((2, "dev")), path, &other))],
        &ask,
    );
    assert_eq!(status, 401, "{body}");
    let changes = envlens::replicas::forward::CHANGES_PATH;
    let (status, body) = post_internal(
        at,
        changes,
        &[(header, &carrying(Some((2, "dev")), path, &ask))],
        &ask,
    );
    assert_eq!(status, 401, "{body}");

    // Refused: a viewer without user_access, no viewer at all, a forged viewer, GitLab's
    // own token, no token.
    let (status, body) = post_internal(
        at,
        path,
        &[(header, &carrying(Some((3, "rep")), path, &ask))],
        &ask,
    );
    assert_eq!(status, 403, "{body}");
    let (status, body) = post_internal(at, path, &[(header, &carrying(None, path, &ask))], &ask);
    assert_eq!(status, 401, "{body}");
    let forged = {
        let (token, _) = envlens::auth::mint_session(
            b"another-key-another-key-another!",
            2,
            "dev",
            Duration::from_secs(60),
        )
        .unwrap();
        let credential = format!(r#"{{"authorization": "Bearer {token}"}}"#);
        signed(Some(&credential), path, &ask)
    };
    let (status, body) = post_internal(at, path, &[(header, &forged)], &ask);
    assert_eq!(status, 401, "{body}");
    let gitlab = internal_token();
    let (status, _) = post_internal(at, path, &[(header, &gitlab)], &ask);
    assert_eq!(status, 401);
    let (status, _) = post_internal(at, path, &[], &ask);
    assert_eq!(status, 401);
    // Bad asks are clear errors.
    let bad = json!({"agent": "x"});
    let bearer = carrying(Some((2, "dev")), path, &bad);
    let (status, body) = post_internal(at, path, &[(header, &bearer)], &bad);
    assert_eq!(status, 400, "{body}");
    let none = json!({"agent": 7, "namespaces": [], "selector": ""});
    let bearer = carrying(Some((2, "dev")), path, &none);
    let (status, body) = post_internal(at, path, &[(header, &bearer)], &none);
    assert_eq!(status, 422, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owner_that_does_not_answer_is_said_and_the_group_listed_here() {
    let world = world().await;
    let setup = &world.setup;
    // A window long enough that the killed owner is still taken for live when asked.
    let mut replicas = vec![
        setup.replica_with_window(&setup.url, "60s").await,
        setup.replica_with_window(&setup.url, "60s").await,
    ];
    let owner_id = setup.settled_owner(&replicas).await.id.clone();
    let before = production(replicas.iter().find(|r| r.id == owner_id).unwrap());
    let at = replicas.iter().position(|r| r.id == owner_id).unwrap();
    let owner = replicas.remove(at);
    let advertised = owner.advertise_url.clone();
    kill_9(owner);
    let other = &replicas[0];
    let (status, body) = whole_group(other, (2, "dev"));
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert!(body.get("errors").is_none(), "{body}");
    let group = &body["data"]["project"]["environment"]["resourceGroup"];
    let warnings = group["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| w
            .as_str()
            .is_some_and(|w| w.contains("did not answer") && w.contains(&advertised))),
        "{group}"
    );
    // Listed here: the same resources as the owner showed.
    let shown: Vec<_> = group["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| json!({"kind": r["kind"], "name": r["name"]}))
        .collect();
    assert_eq!(json!(shown), before["resources"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_in_the_cluster_reaches_a_subscriber_on_a_non_owner() {
    use crate::subscriptions::{Client, Received};
    let world = world().await;
    let (api, setup) = (&world.api, &world.setup);
    let replicas = setup.replicas(2).await;
    let owner = setup.settled_owner(&replicas).await;
    let other = replicas.iter().find(|r| r.id != owner.id).unwrap();
    let mut client = Client::connect(other.addr, "graphql-transport-ws", (2, "dev")).await;
    client
        .subscribe(
            "1",
            "subscription($id: ID!) { resourceGroupUpdated(environmentId: $id) {
                complete upserted { kind name } removed } }",
            json!({"id": super::PRODUCTION}),
        )
        .await;
    let first = client.next_payload("1").await;
    let first = &first["data"]["resourceGroupUpdated"];
    assert_eq!(first["complete"], true, "{first}");
    assert!(
        first["upserted"].as_array().is_some_and(|r| r.len() > 3),
        "{first}"
    );

    // A new object of the group, in the cluster: the owner's watches see it, and the
    // subscriber on the other replica gets it.
    api.insert(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": environment::meta(environment::NS, "late", "uid-late",
                                      environment::gitlab_labels(environment::SLUG, "web"))}));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = client.receive_within(left).await;
        let Some(Received::Message(m)) = message else {
            panic!(
                "no change reached the subscriber on the non-owner: {message:?}\n{}\nOWNER\n{}",
                other.logs(),
                owner.logs()
            );
        };
        let update = &m["payload"]["data"]["resourceGroupUpdated"];
        assert!(m["payload"].get("errors").is_none(), "{m}");
        let upserted = update["upserted"].as_array().unwrap();
        if upserted.iter().any(|r| r["name"] == "late") {
            assert_eq!(update["complete"], false, "only the change: {update}");
            assert_eq!(upserted.len(), 1, "{update}");
            break;
        }
    }
}

// GitLab's watch-API sockets and proxied watches through the owner.

use crate::watch_api::{protocols, Socket};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// `dev`'s bearer session.
fn dev_bearer() -> String {
    let (token, _) =
        envlens::auth::mint_session(SESSION_KEY, 2, "dev", Duration::from_secs(60)).unwrap();
    format!("Bearer {token}")
}

/// A watch token for `dev` on agent 7, as the frontend asks `replica` for it.
fn watch_token(replica: &Replica) -> String {
    let (status, body) = replica.get(
        crate::watch_api::TOKEN_PATH,
        &[("Authorization", &dev_bearer()), ("Gitlab-Agent-Id", "7")],
    );
    assert_eq!(status, 200, "{body}\n{}", replica.logs());
    let body: Value = serde_json::from_str(&body).unwrap();
    body["token"].as_str().unwrap().to_owned()
}

/// A watch-API socket to `replica` opened with `token`.
async fn open_socket(
    replica: &Replica,
    token: &str,
) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    let mut request = format!("ws://{}/k8s-proxy/watch", replica.addr)
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        protocols(token).join(", ").parse().unwrap(),
    );
    tokio_tungstenite::connect_async(request)
        .await
        .map(|(socket, _)| socket)
}

/// The production environment's ConfigMaps: a kind the owner's cache watches for the group.
fn config_maps() -> Value {
    json!({"version": "v1", "resource": "configmaps", "namespace": environment::NS,
           "labelSelector": format!("app.gitlab.com/environment_slug={}", environment::SLUG)})
}

/// Starts the watch `id` of the namespace's ConfigMaps on `socket`.
async fn watch_config_maps(socket: &mut Socket, id: &str) {
    crate::watch_api::watch(socket, id, config_maps()).await;
}

/// A socket to `replica` watching the ConfigMaps (`cm`), its first event (the group's
/// `web-config`) read.
async fn watching_config_maps(replica: &Replica) -> Socket {
    let mut socket = open_socket(replica, &watch_token(replica)).await.unwrap();
    watch_config_maps(&mut socket, "cm").await;
    let first = text_within(&mut socket, Duration::from_secs(30)).await;
    assert_eq!(
        event(&first.expect("the first event")),
        pair("ADDED", "web-config")
    );
    socket
}

/// The next text message of `socket` as sent, within `wait`; `None` when none came.
async fn text_within(socket: &mut Socket, wait: Duration) -> Option<String> {
    use futures_util::StreamExt;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let message = tokio::time::timeout_at(deadline, socket.next())
            .await
            .ok()?;
        match message {
            Some(Ok(Message::Text(text))) => return Some(text.to_string()),
            Some(Ok(Message::Close(frame))) => panic!("the socket closed: {frame:?}"),
            Some(Ok(_)) => {}
            other => panic!("the socket broke: {other:?}"),
        }
    }
}

/// `(event type, object name)` of a data message.
fn event(text: &str) -> (String, String) {
    let m: Value = serde_json::from_str(text).unwrap();
    assert_eq!(m["type"], "data", "{m}");
    (
        m["watchEvent"]["type"].as_str().unwrap().to_owned(),
        m["watchEvent"]["object"]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned(),
    )
}

/// Every message `socket` is sent until it has been quiet for 3 s, after those `wanted`
/// names have arrived (within 60 s): `(event type, name)` each, in order.
async fn events_until(
    socket: &mut Socket,
    wanted: &[&str],
    logs: impl Fn() -> String,
) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let all_in = wanted
            .iter()
            .all(|w| seen.iter().any(|(_, n): &(String, String)| n == w));
        let wait = if all_in {
            Duration::from_secs(3)
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        match text_within(socket, wait).await {
            Some(text) => seen.push(event(&text)),
            None if all_in => return seen,
            None => panic!("{wanted:?} did not all arrive: {seen:?}\n{}", logs()),
        }
    }
}

/// A ConfigMap of the production group, new in the cluster.
fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": environment::meta(environment::NS, name, &format!("uid-{name}"),
                                      environment::gitlab_labels(environment::SLUG, "web"))})
}

/// Watches the cluster was asked for by a user's socket or proxied request rather than by a
/// watch cache (whose watches resume from a version with bookmarks).
fn user_watches(api: &KubeApi) -> Vec<String> {
    api.requests()
        .into_iter()
        .filter(|r| r.query_param("watch").as_deref() == Some("true"))
        .filter(|r| r.query_param("allowWatchBookmarks").is_none())
        .map(|r| format!("{} {}?{}", r.method, r.path, r.query))
        .collect()
}

fn pair(t: &str, n: &str) -> (String, String) {
    (t.to_owned(), n.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_token_from_one_replica_opens_one_socket_on_any_replica() {
    let world = world().await;
    let setup = &world.setup;
    let one = setup.replica(&setup.url).await;
    let two = setup.replica(&setup.url).await;
    let token = watch_token(&one);
    let opened = open_socket(&two, &token).await;
    assert!(
        opened.is_ok(),
        "a token of one replica refused by another: {opened:?}\n{}",
        two.logs()
    );
    // Once: neither replica opens a second socket with it.
    for replica in [&one, &two] {
        let again = open_socket(replica, &token).await;
        match again {
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), 401)
            }
            other => panic!("a spent token opened a socket: {other:?}"),
        }
    }
    // A token no replica of this envlens signed is refused.
    let forged = {
        let other = envlens::auth::Keys::new(envlens::auth::secrets::Secrets {
            internal: envlens::auth::secrets::Secret::new(
                b"another-internal-secret-another!".to_vec(),
            ),
            session: envlens::auth::secrets::Secret::new(SESSION_KEY.to_vec()),
            webhook_token: envlens::auth::secrets::Secret::new(WEBHOOK_TOKEN.as_bytes().to_vec()),
            generated: Vec::new(),
        });
        let claims =
            envlens::auth::watch_token::WatchClaims::new(7, 2, envlens::auth::Via::Bearer, 30);
        other.sign_watch_token(&claims).unwrap()
    };
    assert!(open_socket(&two, &forged).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_socket_on_a_non_owner_is_the_owners_own_answer() {
    let world = world().await;
    let (api, setup) = (&world.api, &world.setup);
    let replicas = setup.replicas(2).await;
    let owner = setup.settled_owner(&replicas).await;
    let other = replicas.iter().find(|r| r.id != owner.id).unwrap();
    production(owner);
    assert!(settled(api).await > 0, "the owner watches the namespace");
    api.clear_requests();

    let mut on_owner = open_socket(owner, &watch_token(owner)).await.unwrap();
    let mut on_other = open_socket(other, &watch_token(other)).await.unwrap();
    watch_config_maps(&mut on_owner, "cm").await;
    watch_config_maps(&mut on_other, "cm").await;
    let wait = Duration::from_secs(30);
    let owners = text_within(&mut on_owner, wait)
        .await
        .expect("the owner's first event");
    let others = text_within(&mut on_other, wait)
        .await
        .unwrap_or_else(|| panic!("nothing on the non-owner's socket\n{}", other.logs()));
    assert_eq!(event(&owners), pair("ADDED", "web-config"));
    assert_eq!(others, owners, "the same message, byte for byte");

    api.insert(config_map("late"));
    let owners = text_within(&mut on_owner, wait)
        .await
        .expect("the change on the owner");
    let others = text_within(&mut on_other, wait)
        .await
        .expect("the change on the non-owner");
    assert_eq!(event(&owners), pair("ADDED", "late"));
    assert_eq!(others, owners);
    // Both from the owner's cache: no watch of the cluster for either socket.
    assert_eq!(user_watches(api), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_socket_goes_on_through_a_handover_with_nothing_lost_or_doubled() {
    let world = world().await;
    let (api, setup) = (&world.api, &world.setup);
    let mut replicas = setup.replicas(3).await;
    let owner_id = setup.settled_owner(&replicas).await.id.clone();
    api.clear_requests();
    let at = replicas.iter().position(|r| r.id != owner_id).unwrap();
    let mut socket = watching_config_maps(&replicas[at]).await;

    // The owner stops (it hands its connections over as it leaves); a change meanwhile.
    let gone = replicas.remove(replicas.iter().position(|r| r.id == owner_id).unwrap());
    let stopping = std::thread::spawn(move || drop(gone));
    api.insert(config_map("during"));
    let new_owner = setup.settled_owner(&replicas).await.id.clone();
    assert_ne!(new_owner, owner_id);
    api.insert(config_map("after"));
    let mut seen = events_until(&mut socket, &["during", "after"], || {
        replicas
            .iter()
            .map(Replica::logs)
            .collect::<Vec<_>>()
            .join("\n----\n")
    })
    .await;
    // Changes that fall in the handover come in one sync, in name order.
    seen.sort();
    assert_eq!(
        seen,
        [pair("ADDED", "after"), pair("ADDED", "during")],
        "each change once, nothing else"
    );
    assert_eq!(user_watches(api), Vec::<String>::new());
    stopping.join().unwrap();
}

/// An owner that refuses a socket's token after another served its watch (the token's use no
/// longer on record, as a day past its expiry) ends the watch with its refusal, once: the
/// replica with the socket does not ask it again for ever while the watcher hears nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_the_next_owner_refuses_ends_with_its_refusal() {
    let world = world().await;
    let setup = &world.setup;
    let mut replicas = setup.replicas(3).await;
    let owner_id = setup.settled_owner(&replicas).await.id.clone();
    let connection = setup.connection().await;
    let rest: Vec<String> = replicas
        .iter()
        .map(|r| r.id.clone())
        .filter(|id| *id != owner_id)
        .collect();
    let next = envlens::replicas::rendezvous::owner(&connection, &rest)
        .unwrap()
        .to_owned();
    // The socket on the replica that owns the connection neither now nor next.
    let at = replicas
        .iter()
        .position(|r| r.id != owner_id && r.id != next)
        .unwrap();
    let mut socket = watching_config_maps(&replicas[at]).await;

    sqlx::query("DELETE FROM watch_tokens_spent")
        .execute(&setup.app.db)
        .await
        .unwrap();
    let gone = replicas.remove(replicas.iter().position(|r| r.id == owner_id).unwrap());
    let stopping = std::thread::spawn(move || drop(gone));
    let said = text_within(&mut socket, Duration::from_secs(60)).await;
    let logs = || {
        replicas
            .iter()
            .map(Replica::logs)
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    let said: Value =
        serde_json::from_str(&said.unwrap_or_else(|| panic!("nothing said\n{}", logs()))).unwrap();
    assert_eq!(said["type"], "error", "{said}");
    assert_eq!(said["watchId"], "cm", "{said}");
    assert_eq!(said["error"]["object"]["code"], 401, "{said}");
    // Once: the watch is over.
    assert_eq!(text_within(&mut socket, Duration::from_secs(3)).await, None);
    stopping.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_kill_9_of_the_owner_a_survivors_socket_and_subscription_lose_and_double_nothing() {
    use crate::subscriptions::{Client, Received};
    let world = world().await;
    let (api, setup) = (&world.api, &world.setup);
    let mut replicas = setup.replicas(3).await;
    let owner_id = setup.settled_owner(&replicas).await.id.clone();
    api.clear_requests();
    let survivor = replicas.iter().position(|r| r.id != owner_id).unwrap();
    let survivor_addr = replicas[survivor].addr;
    let mut socket = watching_config_maps(&replicas[survivor]).await;
    let mut client = Client::connect(survivor_addr, "graphql-transport-ws", (2, "dev")).await;
    client
        .subscribe(
            "1",
            "subscription($id: ID!) { resourceGroupUpdated(environmentId: $id) {
                complete upserted { kind name } removed } }",
            json!({"id": super::PRODUCTION}),
        )
        .await;
    let whole = client.next_payload("1").await;
    assert_eq!(
        whole["data"]["resourceGroupUpdated"]["complete"], true,
        "{whole}"
    );

    // kill -9: the owner's lease runs out (the window, 3 s) before another takes it.
    let killed = Instant::now();
    kill_9(replicas.remove(replicas.iter().position(|r| r.id == owner_id).unwrap()));
    api.insert(config_map("during"));
    let logs = || {
        replicas
            .iter()
            .map(Replica::logs)
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    let arrived = text_within(&mut socket, Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("no change after the kill\n{}", logs()));
    let failover = killed.elapsed();
    assert_eq!(event(&arrived), pair("ADDED", "during"));
    let new_owner = setup.settled_owner(&replicas).await.id.clone();
    eprintln!(
        "failover: kill -9 of the owner to the first change on a survivor's socket: {failover:?} \
         (window 3 s; new owner {new_owner}; load {})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    api.insert(config_map("after"));
    let seen = events_until(&mut socket, &["after"], logs).await;
    assert_eq!(
        seen,
        [pair("ADDED", "after")],
        "each change once, nothing else"
    );

    // The subscription on the survivor: each change once, as a change (never the whole group
    // again), nothing lost.
    let mut upserted: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = ["during", "after"]
            .iter()
            .all(|n| upserted.iter().any(|u| u == n));
        let wait = match done {
            true => Duration::from_secs(3),
            false => deadline.saturating_duration_since(Instant::now()),
        };
        match client.receive_within(wait).await {
            Some(Received::Message(m)) => {
                let update = &m["payload"]["data"]["resourceGroupUpdated"];
                assert!(m["payload"].get("errors").is_none(), "{m}");
                assert_eq!(update["complete"], false, "only changes: {update}");
                assert_eq!(update["removed"], json!([]), "{update}");
                for r in update["upserted"].as_array().unwrap() {
                    upserted.push(r["name"].as_str().unwrap().to_owned());
                }
            }
            None if done => break,
            other => panic!(
                "the subscription: {other:?}, upserted {upserted:?}\n{}",
                logs()
            ),
        }
    }
    upserted.sort();
    assert_eq!(upserted, ["after", "during"], "each change once");
    assert_eq!(user_watches(api), Vec::<String>::new());
}

/// A proxied watch of the namespace's ConfigMaps through `replica`, as `dev`: the stream.
async fn proxied_watch(replica: &Replica) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(replica.addr).await.unwrap();
    let request = format!(
        "GET /k8s-proxy/api/v1/namespaces/{}/configmaps?watch=true HTTP/1.1\r\nHost: envlens\r\n\
         Authorization: {}\r\nGitlab-Agent-Id: 7\r\nConnection: close\r\n\r\n",
        environment::NS,
        dev_bearer()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

/// Reads `stream` until `wanted` shows in what it sent (within 30 s): all it sent so far.
async fn read_until(stream: &mut tokio::net::TcpStream, seen: &mut String, wanted: &str) {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut buffer = [0u8; 16 * 1024];
    while !seen.contains(wanted) {
        let read = tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await;
        match read {
            Ok(Ok(n)) if n > 0 => seen.push_str(&String::from_utf8_lossy(&buffer[..n])),
            other => panic!("{wanted} never came: {other:?}\n{seen}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proxied_watch_on_a_non_owner_is_served_by_the_owner() {
    use tokio::io::AsyncReadExt;
    let world = world().await;
    let (api, setup) = (&world.api, &world.setup);
    let mut replicas = setup.replicas(2).await;
    let owner_id = setup.settled_owner(&replicas).await.id.clone();
    let other = replicas.iter().position(|r| r.id != owner_id).unwrap();
    let mut stream = proxied_watch(&replicas[other]).await;
    let mut seen = String::new();
    read_until(&mut stream, &mut seen, "web-config").await;
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    api.insert(config_map("late"));
    read_until(&mut stream, &mut seen, "\"late\"").await;

    // Through the owner: when it dies, the stream it served ends (a Kubernetes client then
    // watches again, through the new owner), where a watch of this replica's own would go on.
    kill_9(replicas.remove(replicas.iter().position(|r| r.id == owner_id).unwrap()));
    let other = &replicas[0];
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the proxied watch outlived the owner that served it\n{}",
        other.logs()
    );
    // Watched again once the connection is owned again: the objects, as before.
    setup.settled_owner(&replicas).await;
    let mut again = proxied_watch(other).await;
    let mut seen = String::new();
    read_until(&mut again, &mut seen, "\"late\"").await;
    read_until(&mut again, &mut seen, "web-config").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_owner_checks_the_watches_handed_to_it_itself() {
    let world = world().await;
    let setup = &world.setup;
    let replicas = setup.replicas(1).await;
    let owner = setup.settled_owner(&replicas).await;
    let at = &owner.advertise_url;
    let header = envlens::auth::REPLICA_HEADER;
    let keys = keys();
    let carrying_token = |token: &str, path: &str, ask: &Value| {
        let credential = envlens::auth::Credential::of_watch_socket(token).encode();
        signed(Some(&credential), path, ask)
    };
    let ask = json!({"agent": 7, "params": config_maps()});
    let path = envlens::replicas::forward::WATCH_PATH;
    // A token this envlens signed but no socket was opened with: refused.
    let unspent = keys
        .sign_watch_token(&envlens::auth::watch_token::WatchClaims::new(
            7,
            2,
            envlens::auth::Via::Bearer,
            30,
        ))
        .unwrap();
    let (status, body) = post_internal(
        at,
        path,
        &[(header, &carrying_token(&unspent, path, &ask))],
        &ask,
    );
    assert_eq!(status, 401, "{body}");
    // A token spent on a socket, for a viewer without user_access (a socket refused spends
    // nothing: the token is recorded spent as a replica whose viewer then lost their access
    // would have): refused by the owner.
    let claims = envlens::auth::watch_token::WatchClaims::new(7, 3, envlens::auth::Via::Bearer, 30);
    let rep = keys.sign_watch_token(&claims).unwrap();
    assert!(
        open_socket(owner, &rep).await.is_err(),
        "rep has no user_access"
    );
    sqlx::query(
        "INSERT INTO watch_tokens_spent (id, expires_at) VALUES ($1, now() + interval '1 day')",
    )
    .bind(&claims.jti)
    .execute(&setup.app.db)
    .await
    .unwrap();
    let (status, body) = post_internal(
        at,
        path,
        &[(header, &carrying_token(&rep, path, &ask))],
        &ask,
    );
    assert_eq!(status, 403, "{body}");
    // dev's spent token, for another agent than the one asked: refused.
    let token = watch_token(owner);
    let _socket = open_socket(owner, &token).await.unwrap();
    let other_agent = json!({"agent": 8, "params": config_maps()});
    let (status, body) = post_internal(
        at,
        path,
        &[(header, &carrying_token(&token, path, &other_agent))],
        &other_agent,
    );
    assert_eq!(status, 403, "{body}");
    // No token at all; GitLab's own internal token: refused.
    let (status, _) = post_internal(at, path, &[(header, &carrying(None, path, &ask))], &ask);
    assert_eq!(status, 401);
    let (status, _) = post_internal(at, path, &[(header, &internal_token())], &ask);
    assert_eq!(status, 401);

    // A proxied watch: the carried credential authenticated as the proxy does.
    let proxy = envlens::replicas::forward::PROXY_PATH;
    let watch_uri = format!(
        "/api/v1/namespaces/{}/configmaps?watch=true",
        environment::NS
    );
    let ask = json!({"agent": 7, "uri": watch_uri, "headers": []});
    let (status, body) = post_internal(
        at,
        proxy,
        &[(header, &carrying(Some((3, "rep")), proxy, &ask))],
        &ask,
    );
    assert_eq!(status, 401, "rep: {body}");
    let not_a_watch = json!({"agent": 7, "uri": "/api/v1/namespaces/shop/secrets", "headers": []});
    let (status, body) = post_internal(
        at,
        proxy,
        &[(header, &carrying(Some((2, "dev")), proxy, &not_a_watch))],
        &not_a_watch,
    );
    assert_eq!(status, 422, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_socket_on_the_owner_follows_its_connection_to_a_new_replica() {
    let world = world().await;
    let (api, setup) = (&world.api, &world.setup);
    let mut replicas = setup.replicas(1).await;
    let mut first = setup.settled_owner(&replicas).await.id.clone();
    // A new replica wins the connection if it scores above the owner, whose score is a
    // uniform draw u: with odds 1 - u each. An owner scoring high would need many joins (all
    // of 16 lose with odds 1/17 over u), so one in the upper half is replaced first.
    let connection = setup.connection().await;
    let probes: Vec<String> = (0..200).map(|i| format!("probe-{i}")).collect();
    let beats = |id: &str| {
        let beaten = probes.iter().filter(|p| {
            envlens::replicas::rendezvous::owner(&connection, &[id.to_owned(), p.to_string()])
                == Some(id)
        });
        beaten.count()
    };
    while beats(&first) > probes.len() / 2 {
        let high = std::mem::replace(&mut replicas[0], setup.replica(&setup.url).await);
        std::thread::spawn(move || drop(high));
        first = setup.settled_owner(&replicas).await.id.clone();
    }
    api.clear_requests();
    let mut socket = watching_config_maps(&replicas[0]).await;
    // A replica joins and, if it does not win the connection (odds 1/2 or more), leaves
    // again, until one wins: the owner hands the connection over, alive.
    let mut changes = Vec::new();
    for attempt in 0.. {
        assert!(attempt < 40, "the connection never moved");
        replicas.push(setup.replica(&setup.url).await);
        let name = format!("joined-{attempt}");
        api.insert(config_map(&name));
        changes.push(name);
        if setup.settled_owner(&replicas).await.id != first {
            break;
        }
        let lost = replicas.pop().unwrap();
        std::thread::spawn(move || drop(lost));
    }
    api.insert(config_map("after"));
    changes.push("after".into());
    let wanted: Vec<&str> = changes.iter().map(String::as_str).collect();
    let mut seen = events_until(&mut socket, &wanted, || replicas[0].logs()).await;
    seen.sort();
    let mut expected: Vec<_> = wanted.iter().map(|n| pair("ADDED", n)).collect();
    expected.sort();
    assert_eq!(seen, expected, "each change once, nothing else");
    assert_eq!(user_watches(api), Vec::<String>::new());
}
