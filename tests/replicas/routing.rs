//! Views routed through the owner of a connection (SPEC 16): a `resourceGroup` asked of a
//! replica that does not own the agent's connection is answered by the owner, byte for byte
//! what the owner answers itself, without a list of the cluster by the replica asked; the
//! owner authenticates the viewer afresh and decides their `user_access` itself; an owner that
//! cannot be reached is said, and the group is listed by the replica asked.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::ownership::{kill_9, production, settled, setup};
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
    let api = KubeApi::new();
    environment::environment(&api);
    let dir = tempfile::tempdir().unwrap();
    let served = api.serve(dir.path()).await;
    let setup = setup(&served).await;
    let replicas = [
        setup.replica(&setup.url).await,
        setup.replica(&setup.url).await,
        setup.replica(&setup.url).await,
    ];
    let owner = setup.settled_owner(&replicas).await;
    production(owner);
    assert!(settled(&api).await > 0, "the owner watches the namespace");
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
    lists_settled(&api).await;
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
        lists(&api),
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
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let body = body.to_string();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}

/// A replica's token carrying `user`'s bearer session as their credential.
fn carrying(user: Option<(i64, &str)>) -> String {
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
    envlens::auth::mint_replica(INTERNAL_KEY, credential.as_deref()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_owner_authenticates_the_viewer_and_decides_their_access_itself() {
    let api = KubeApi::new();
    environment::environment(&api);
    let dir = tempfile::tempdir().unwrap();
    let served = api.serve(dir.path()).await;
    let setup = setup(&served).await;
    let replicas = [setup.replica(&setup.url).await];
    let owner = setup.settled_owner(&replicas).await;
    let ask = json!({"agent": 7, "namespaces": [environment::NS],
                     "selector": envlens::resources::group::label_selector(environment::PROJECT, environment::SLUG)});
    let path = envlens::replicas::forward::RESOURCE_GROUP_PATH;
    let at = &owner.advertise_url;
    let header = envlens::auth::REPLICA_HEADER;

    let (status, body) = post_internal(at, path, &[(header, &carrying(Some((2, "dev"))))], &ask);
    assert_eq!(status, 200, "{body}");
    let group = envlens::replicas::wire::decode(body.as_bytes()).expect("a group");
    assert!(group.resources.len() > 3, "{body}");

    // Refused: a viewer without user_access, no viewer at all, a forged viewer, GitLab's
    // own token, no token.
    let (status, body) = post_internal(at, path, &[(header, &carrying(Some((3, "rep"))))], &ask);
    assert_eq!(status, 403, "{body}");
    let (status, body) = post_internal(at, path, &[(header, &carrying(None))], &ask);
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
        envlens::auth::mint_replica(INTERNAL_KEY, Some(&credential)).unwrap()
    };
    let (status, body) = post_internal(at, path, &[(header, &forged)], &ask);
    assert_eq!(status, 401, "{body}");
    let gitlab = internal_token();
    let (status, _) = post_internal(at, path, &[(header, &gitlab)], &ask);
    assert_eq!(status, 401);
    let (status, _) = post_internal(at, path, &[], &ask);
    assert_eq!(status, 401);
    // Bad asks are clear errors.
    let bearer = carrying(Some((2, "dev")));
    let (status, body) = post_internal(at, path, &[(header, &bearer)], &json!({"agent": "x"}));
    assert_eq!(status, 400, "{body}");
    let none = json!({"agent": 7, "namespaces": [], "selector": ""});
    let (status, body) = post_internal(at, path, &[(header, &bearer)], &none);
    assert_eq!(status, 422, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owner_that_does_not_answer_is_said_and_the_group_listed_here() {
    let api = KubeApi::new();
    environment::environment(&api);
    let dir = tempfile::tempdir().unwrap();
    let served = api.serve(dir.path()).await;
    let setup = setup(&served).await;
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
    let api = KubeApi::new();
    environment::environment(&api);
    let dir = tempfile::tempdir().unwrap();
    let served = api.serve(dir.path()).await;
    let setup = setup(&served).await;
    let replicas = [
        setup.replica(&setup.url).await,
        setup.replica(&setup.url).await,
    ];
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
