//! How the watch cache's streams reach a cluster (`k8s::connection::streams_builder`): over TLS
//! to a server that accepts `h2` (as an API server does) they are HTTP/2 streams of one
//! connection, which deliver events and come back on a new connection when the server breaks
//! it, go on when it says GOAWAY (new ones over a new connection), and stay within its own
//! limit of streams a connection; over plain `http://` each goes over an HTTP/1.1 connection of
//! its own. kubectl reaches the TLS server too.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Version};
use envlens::k8s::clusters::Cluster;
use envlens::k8s::fetch::FetchOptions;
use envlens::resources::group::{self, label_selector, ResourceGroup};
use envlens::telemetry::Metrics;

use crate::support::environment::*;
use crate::support::kube_api::{KubeApi, RecordedRequest, Served};

struct Setup {
    api: KubeApi,
    served: Served,
    _dir: tempfile::TempDir,
    cluster: Cluster,
    metrics: Arc<Metrics>,
}

/// The environment on the test server (over TLS if `tls`), and agent 7's cluster as envlens
/// builds it from the server's kubeconfig.
async fn setup(tls: bool) -> Setup {
    setup_with(tls, |_| {}).await
}

/// [`setup`], the server set up by `server` before it serves.
async fn setup_with(tls: bool, server: impl FnOnce(&KubeApi)) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment(&api);
    server(&api);
    let served = match tls {
        true => api.serve_tls(dir.path()).await,
        false => api.serve(dir.path()).await,
    };
    let yaml = format!("kubernetes:\n{}", served.connections(&["7"]));
    let settings = envlens::config::file::Settings::parse(&yaml).unwrap();
    let metrics = Arc::new(Metrics::default());
    let cluster = envlens::k8s::clusters::Clusters::load(&settings.kubernetes, metrics.clone())
        .await
        .expect("test clusters")
        .for_agent(7, "acme/agents", "prod")
        .await
        .expect("agent 7 is reached");
    Setup {
        api,
        served,
        _dir: dir,
        cluster,
        metrics,
    }
}

impl Setup {
    /// The group the watch cache answers.
    async fn cached(&self) -> ResourceGroup {
        self.cached_in(NS).await
    }

    /// The group the watch cache answers in `namespace`.
    async fn cached_in(&self, namespace: &str) -> ResourceGroup {
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
                namespace,
                &label_selector(PROJECT, SLUG),
                &options,
            )
            .await
            .unwrap();
        group::assemble(listing, &Default::default())
    }

    /// [`Setup::cached_in`], which must show no error and nothing out of date.
    async fn viewed(&self, namespace: &str) -> ResourceGroup {
        let group = self.cached_in(namespace).await;
        assert!(group.errors.is_empty(), "{namespace}: {:?}", group.errors);
        assert!(
            !group.warnings.iter().any(|w| w.contains("out of date")),
            "{namespace}: {:?}",
            group.warnings
        );
        group
    }

    /// Views the group until it shows the pod `name` (within 10 s): the watch brought it.
    async fn shows(&self, name: &str, what: &str) {
        self.shows_in(NS, name, what).await
    }

    /// [`Setup::shows`] in `namespace`, every view without an error or anything out of date.
    async fn shows_in(&self, namespace: &str, name: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let group = self.viewed(namespace).await;
            if group.resources.iter().any(|r| r.name == name) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {name} never shown");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How often agent 7's connection was found down (a request of its clients failed).
    fn found_down(&self) -> u64 {
        let text = self.metrics.render(None);
        text.lines()
            .filter(|l| l.starts_with("envlens_agent_status_changes_total{"))
            .filter(|l| l.contains(r#"status="unreachable""#))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
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

    /// How many kinds the view listed: as many watches follow (in each namespace viewed).
    fn listed_kinds(&self) -> usize {
        self.api
            .request_counts()
            .keys()
            .filter(|(v, _)| v == "list")
            .count()
    }

    /// The watch requests received so far: their HTTP version and connection (its client end).
    fn watches(&self) -> Vec<(Version, SocketAddr)> {
        self.watch_requests()
            .into_iter()
            .map(|r| (r.version, r.peer.expect("served")))
            .collect()
    }

    fn watch_requests(&self) -> Vec<RecordedRequest> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r.query_param("watch").as_deref() == Some("true"))
            .collect()
    }

    /// The lists received so far.
    fn lists(&self) -> u64 {
        self.api
            .request_counts()
            .iter()
            .filter(|((verb, _), _)| verb == "list")
            .map(|(_, n)| n)
            .sum()
    }

    /// Waits (up to 15 s) until `sent` watches have been sent and `open` are open on the
    /// server.
    async fn sent_and_open(&self, sent: usize, open: usize, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.watches().len() < sent || self.api.open_streams() < open {
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {sent} watches sent, {} of {open} open",
                self.watches().len(),
                self.api.open_streams()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A pod labelled for the environment in namespace `ns`.
fn pod_in(ns: &str, name: &str) -> serde_json::Value {
    let mut pod = labelled_pod(name);
    pod["metadata"]["namespace"] = ns.into();
    pod
}

/// Another namespace viewed with the same selector: its watches come after the first's.
const OTHER: &str = "other";

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

/// An API server's GOAWAY (on shutdown, or at random with `--goaway-chance`): the watches open
/// go on over the connection that said it, new watches go over a new connection; when the
/// server then ends the watches, they resume from their versions over the new connection, and
/// what changed meanwhile shows. No watch fails, no view shows an error or anything out of
/// date, the connection is never found down.
#[tokio::test]
async fn watches_over_http2_go_on_when_the_server_says_goaway() {
    let s = setup(true).await;
    s.viewed(NS).await;
    let kinds = s.listed_kinds();
    s.sent_and_open(kinds, kinds, "first view").await;
    let first: BTreeSet<SocketAddr> = s.watches().iter().map(|(_, peer)| *peer).collect();
    assert_eq!(first.len(), 1, "{:?}", s.watches());

    s.api.go_away().await;
    // The GOAWAY went before the event on the watches' connection: the client has read it.
    s.api.insert(labelled_pod("after-goaway"));
    s.shows("after-goaway", "over the watches open").await;
    assert_eq!(s.watches().len(), kinds, "no watch was sent again");

    // A new view's watches go over a new connection, none over the one that said GOAWAY.
    s.viewed(OTHER).await;
    s.sent_and_open(2 * kinds, 2 * kinds, "second view").await;
    let second = &s.watches()[kinds..];
    assert_eq!(second.len(), kinds, "{second:?}");
    assert!(
        second
            .iter()
            .all(|(version, peer)| *version == Version::HTTP_2 && !first.contains(peer)),
        "{second:?}"
    );
    s.api.insert(pod_in(OTHER, "elsewhere"));
    s.shows_in(OTHER, "elsewhere", "over the new watches").await;

    // The server ends every watch (as an API server does before it stops): they resume from
    // their versions, none over the connection that said GOAWAY, none listed again.
    let lists = s.lists();
    let sent = s.watches().len();
    s.api.drop_watches();
    s.api.insert(labelled_pod("while-resuming"));
    s.sent_and_open(sent + 2 * kinds, 2 * kinds, "the watches resumed")
        .await;
    s.shows("while-resuming", "after the watches resumed").await;
    let resumed = &s.watch_requests()[sent..];
    assert!(
        resumed.iter().all(|r| r.version == Version::HTTP_2
            && !first.contains(&r.peer.unwrap())
            && r.query_param("resourceVersion")
                .is_some_and(|v| !v.is_empty())),
        "{resumed:?}"
    );
    assert_eq!(s.lists(), lists, "nothing listed again");
    assert_eq!(s.found_down(), 0, "the connection was found down");
}

/// A server allowing 10 streams a connection (`--http2-max-streams-per-connection`), and two
/// namespaces viewed: their watches, sent at once per view, go 10 a connection, each sent once
/// and answered (beyond the server's limit a stream would be refused, or wait for another to
/// end), and bring events. No view shows an error, the connection is never found down.
#[tokio::test]
async fn watches_over_http2_stay_within_the_servers_limit_of_streams() {
    let s = setup_with(true, |api| api.limit_streams_per_connection(10)).await;
    s.viewed(NS).await;
    let kinds = s.listed_kinds();
    s.sent_and_open(kinds, kinds, "first view").await;
    s.viewed(OTHER).await;
    let watches = 2 * kinds;
    assert!(watches >= 19, "{watches} watches: too few for the test");
    s.sent_and_open(watches, watches, "second view").await;
    let mut per_connection: BTreeMap<SocketAddr, usize> = BTreeMap::new();
    for (version, peer) in s.watches() {
        assert_eq!(version, Version::HTTP_2);
        *per_connection.entry(peer).or_default() += 1;
    }
    assert_eq!(s.watches().len(), watches, "each watch sent once");
    assert!(
        per_connection.values().all(|n| *n <= 10),
        "{per_connection:?}"
    );
    assert_eq!(
        per_connection.len(),
        watches.div_ceil(10),
        "{per_connection:?}"
    );
    s.api.insert(labelled_pod("here"));
    s.api.insert(pod_in(OTHER, "there"));
    s.shows("here", "in the first namespace").await;
    s.shows_in(OTHER, "there", "in the second namespace").await;
    assert_eq!(s.found_down(), 0, "the connection was found down");
}
