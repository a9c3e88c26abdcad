//! How the watch cache's streams reach a cluster (`k8s::connection::streams_builder`): over TLS
//! to a server that accepts `h2` (as an API server does) they are HTTP/2 streams of one
//! connection, which deliver events and come back on a new connection when the server breaks
//! it; over plain `http://` each goes over an HTTP/1.1 connection of its own. kubectl reaches
//! the TLS server too.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Version};
use envlens::k8s::clusters::Cluster;
use envlens::k8s::fetch::FetchOptions;
use envlens::resources::group::{self, label_selector, ResourceGroup};

use crate::support::environment::*;
use crate::support::kube_api::{KubeApi, Served};

struct Setup {
    api: KubeApi,
    served: Served,
    _dir: tempfile::TempDir,
    cluster: Cluster,
}

/// The environment on the test server (over TLS if `tls`), and agent 7's cluster as envlens
/// builds it from the server's kubeconfig.
async fn setup(tls: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment(&api);
    let served = match tls {
        true => api.serve_tls(dir.path()).await,
        false => api.serve(dir.path()).await,
    };
    let yaml = format!("kubernetes:\n{}", served.connections(&["7"]));
    let settings = envlens::config::file::Settings::parse(&yaml).unwrap();
    let cluster = crate::support::clusters(&settings)
        .await
        .for_agent(7, "acme/agents", "prod")
        .await
        .expect("agent 7 is reached");
    Setup {
        api,
        served,
        _dir: dir,
        cluster,
    }
}

impl Setup {
    /// The group the watch cache answers.
    async fn cached(&self) -> ResourceGroup {
        let options = FetchOptions {
            request_timeout: Duration::from_secs(5),
            ..FetchOptions::default()
        };
        let listing = self
            .cluster
            .watch
            .list_resource_group(
                &self.cluster.discovery,
                &HeaderMap::new(),
                NS,
                &label_selector(PROJECT, SLUG),
                &options,
            )
            .await
            .unwrap();
        group::assemble(listing, &Default::default())
    }

    /// Views the group until it shows the pod `name` (within 10 s): the watch brought it.
    async fn shows(&self, name: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let group = self.cached().await;
            if group.resources.iter().any(|r| r.name == name) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {name} never shown");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (up to 15 s) until `n` watches are open on the server.
    async fn watching(&self, n: usize, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.api.open_streams() < n {
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {n} watches open",
                self.api.open_streams()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The watch requests received so far: their HTTP version and connection (its client end).
    /// How many kinds the view listed: as many watches follow.
    fn listed_kinds(&self) -> usize {
        self.api
            .request_counts()
            .keys()
            .filter(|(v, _)| v == "list")
            .count()
    }

    fn watches(&self) -> Vec<(Version, SocketAddr)> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r.query_param("watch").as_deref() == Some("true"))
            .map(|r| (r.version, r.peer.expect("served")))
            .collect()
    }
}

#[tokio::test]
async fn over_tls_the_watches_are_http2_streams_of_one_connection_and_deliver_events() {
    let s = setup(true).await;
    let first = s.cached().await;
    assert!(first.resources.len() > 10, "{:?}", first.resources.len());
    let kinds = s.listed_kinds();
    s.watching(kinds, "first view").await;
    let watches = s.watches();
    assert!(watches.len() >= kinds, "{watches:?}");
    assert!(
        watches
            .iter()
            .all(|(version, _)| *version == Version::HTTP_2),
        "{watches:?}"
    );
    let connections: BTreeSet<SocketAddr> = watches.iter().map(|(_, peer)| *peer).collect();
    assert_eq!(
        connections.len(),
        1,
        "one connection carries every watch: {watches:?}"
    );
    // The lists went over HTTP/1.1 connections of their own, none of them the watches'.
    let lists: Vec<_> = s
        .api
        .requests()
        .into_iter()
        .filter(|r| r.query_param("watch").is_none() && r.path.contains("/namespaces/"))
        .collect();
    assert!(!lists.is_empty());
    assert!(lists
        .iter()
        .all(|r| r.version == Version::HTTP_11 && !connections.contains(&r.peer.unwrap())));

    s.api.insert(labelled_pod("added"));
    s.shows("added", "after a create").await;
}

#[tokio::test]
async fn watches_over_http2_come_back_when_the_server_breaks_their_connection() {
    let s = setup(true).await;
    s.cached().await;
    let kinds = s.listed_kinds();
    s.watching(kinds, "first view").await;
    let before: BTreeSet<SocketAddr> = s.watches().iter().map(|(_, peer)| *peer).collect();
    assert_eq!(before.len(), 1);
    let sent = s.watches().len();

    s.api.close_connections();
    // The watches come back (over a new connection), and what changed meanwhile shows.
    s.api.insert(labelled_pod("while-broken"));
    s.shows("while-broken", "after the connection broke").await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while s.watches().len() < sent + kinds || s.api.open_streams() < kinds {
        assert!(
            Instant::now() < deadline,
            "the watches never came back: {} sent again, {} open",
            s.watches().len() - sent,
            s.api.open_streams()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = &s.watches()[sent..];
    assert!(again
        .iter()
        .all(|(version, peer)| *version == Version::HTTP_2 && !before.contains(peer)));
    s.api.insert(labelled_pod("after"));
    s.shows("after", "after the watches came back").await;
}

#[tokio::test]
async fn over_plain_http_each_watch_has_an_http1_connection() {
    let s = setup(false).await;
    s.cached().await;
    let kinds = s.listed_kinds();
    s.watching(kinds, "first view").await;
    let watches = s.watches();
    assert!(
        watches
            .iter()
            .all(|(version, _)| *version == Version::HTTP_11),
        "{watches:?}"
    );
    let connections: BTreeSet<SocketAddr> = watches.iter().map(|(_, peer)| *peer).collect();
    assert_eq!(connections.len(), watches.len(), "{watches:?}");
    s.api.insert(labelled_pod("added"));
    s.shows("added", "after a create").await;
}

#[tokio::test]
async fn kubectl_reaches_the_tls_server() {
    let s = setup(true).await;
    let mut kubectl = s.served.kubectl();
    kubectl.args(["get", "pods", "-n", NS, "-o", "name"]);
    let out = tokio::task::spawn_blocking(move || kubectl.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("pod/"));
    // kubectl offers h2, and speaks it.
    assert!(s
        .api
        .requests()
        .iter()
        .any(|r| r.path.ends_with("/pods") && r.version == Version::HTTP_2));
}
