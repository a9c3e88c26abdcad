//! Replicas that share the clusters (SPEC 16): several `serve` processes on one database and
//! one in-process Kubernetes API server. Each connection is watched by one replica, whatever
//! their number; a replica cut from the database stops watching before its lease can be
//! taken, and another one takes it.

use std::time::{Duration, Instant};

use envlens::config::Limits;
use envlens::state::AppState;
use serde_json::Value;
use tokio::sync::watch;

use super::{base64_of, Replica};
use crate::support::environment::{self, agent_config};
use crate::support::kube_api::{KubeApi, Served};
use crate::support::*;

/// Short enough that a takeover happens within a test, long enough for a loaded machine.
const WINDOW: &str = "3s";

/// The database, GitLab's side recorded in it (agent 7 reads as itself), the secrets and a
/// configuration file leading agent 7 to `served`, whose namespaces stay watched while the
/// test runs.
pub(super) struct Setup {
    pub(super) url: String,
    secrets: tempfile::TempDir,
    config: tempfile::NamedTempFile,
    pub(super) app: TestApp,
}

pub(super) async fn setup(served: &Served) -> Setup {
    let (url, database) = crate::telemetry::database_url().await;
    let app = TestApp::owning(
        AppState::new((*database).clone(), keys(), Limits::default()),
        database,
    );
    setup_on(served, url, app).await
}

/// [`setup`] on a database of the caller's: `url` for the replicas, `app` to seed it.
pub(super) async fn setup_on(served: &Served, url: String, app: TestApp) -> Setup {
    environment::seed(&app).await;
    environment::configure(&app, 7, &agent_config("agent")).await;
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(secrets.path().join("session"), base64_of(SESSION_KEY)).unwrap();
    std::fs::write(secrets.path().join("internal"), base64_of(INTERNAL_KEY)).unwrap();
    std::fs::write(secrets.path().join("webhook"), WEBHOOK_TOKEN).unwrap();
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        config.path(),
        format!(
            "kubernetes:\n  cache_idle: 10m\n  response_timeout: 5s\n{}",
            served.connections(&["7"])
        ),
    )
    .unwrap();
    Setup {
        url,
        secrets,
        config,
        app,
    }
}

impl Setup {
    pub(super) async fn replica(&self, database_url: &str) -> Replica {
        self.replica_with_window(database_url, WINDOW).await
    }

    /// `n` replicas on the setup's own database, started one after another.
    pub(super) async fn replicas(&self, n: usize) -> Vec<Replica> {
        let mut replicas = Vec::with_capacity(n);
        for _ in 0..n {
            replicas.push(self.replica(&self.url).await);
        }
        replicas
    }

    /// [`Setup::replica`] with another `--replica-window`.
    pub(super) async fn replica_with_window(&self, database_url: &str, window: &str) -> Replica {
        let config = self.config.path().to_str().unwrap();
        Replica::start_with(
            database_url,
            self.secrets.path(),
            &[
                "--config",
                config,
                "--replica-window",
                window,
                "--share-clusters",
            ],
        )
        .await
    }

    /// Who holds agent 7's connection now (its lease not expired), and the lease's generation.
    async fn holder(&self) -> Option<(String, i64)> {
        sqlx::query_as("SELECT replica, generation FROM connection_leases WHERE expires_at > now()")
            .fetch_optional(&self.app.db)
            .await
            .unwrap()
    }

    /// Waits (generously) until the connection's lease is held by the replica that rendezvous
    /// hashing picks among `replicas`: ownership has settled. That replica.
    pub(super) async fn settled_owner<'a>(&self, replicas: &'a [Replica]) -> &'a Replica {
        let ids: Vec<String> = replicas.iter().map(|r| r.id.clone()).collect();
        let connection = self.connection().await;
        let owner = envlens::replicas::rendezvous::owner(&connection, &ids).unwrap();
        self.wait_holder("the lease settles on its rendezvous owner", |h| {
            h.as_ref().is_some_and(|(id, _)| id == owner)
        })
        .await;
        let owner = replicas.iter().find(|r| r.id == owner).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while holds(owner).is_none_or(|h| h.is_empty()) {
            assert!(Instant::now() < deadline, "the owner never says it holds");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        owner
    }

    /// The key of agent 7's connection, once some replica has leased it.
    pub(super) async fn connection(&self) -> String {
        self.wait_holder("some replica leases the connection", Option::is_some)
            .await;
        sqlx::query_scalar("SELECT connection FROM connection_leases")
            .fetch_one(&self.app.db)
            .await
            .unwrap()
    }

    /// Waits (generously) until `condition` holds of the holder.
    async fn wait_holder(&self, what: &str, condition: impl Fn(&Option<(String, i64)>) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let holder = self.holder().await;
            if condition(&holder) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: the lease is {holder:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The production group as `dev`, through `replica`'s GraphQL: its resources, or the answer.
pub(super) fn production(replica: &Replica) -> Value {
    let (token, _) =
        envlens::auth::mint_session(SESSION_KEY, 2, "dev", Duration::from_secs(60)).unwrap();
    let query = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
        resourceGroup { resources { kind name } errors { kind message } } } } }"#;
    let (status, body) = replica.post(
        "/api/graphql",
        &[("Authorization", &format!("Bearer {token}"))],
        &serde_json::json!({ "query": query }),
    );
    assert_eq!(status, 200, "{body}\n{}", replica.logs());
    let body: Value = serde_json::from_str(&body).unwrap();
    let group = body["data"]["project"]["environment"]["resourceGroup"].clone();
    assert!(
        group["resources"].as_array().is_some_and(|r| !r.is_empty()),
        "{body}\n{}",
        replica.logs()
    );
    group
}

/// Waits until the server's open watch streams stop moving (the same for 1.5 s); their number.
pub(super) async fn settled(api: &KubeApi) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut last, mut since) = (api.open_streams(), Instant::now());
    while since.elapsed() < Duration::from_millis(1500) {
        assert!(Instant::now() < deadline, "the watches never settle");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = api.open_streams();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

/// A replica's token for GET `/-/replica`.
pub(super) fn signed_whoami() -> String {
    let request = envlens::auth::replica_request(&axum::http::Method::GET, "/-/replica", b"");
    envlens::auth::mint_replica(INTERNAL_KEY, None, &request).unwrap()
}

/// GET `/-/replica` of a replica's internal listener with `headers`: the status and the body
/// (0 when nothing listens).
pub(super) fn whoami(advertise_url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let host = advertise_url.strip_prefix("http://").unwrap();
    super::http(host, "GET", "/-/replica", headers, None)
}

/// The test cluster (the production environment's objects), served on a socket, and the
/// database and configuration the replicas share.
pub(super) struct World {
    pub(super) api: KubeApi,
    pub(super) setup: Setup,
    _served: Served,
    _dir: tempfile::TempDir,
}

pub(super) async fn world() -> World {
    let api = KubeApi::new();
    environment::environment(&api);
    let dir = tempfile::tempdir().unwrap();
    let served = api.serve(dir.path()).await;
    let setup = setup(&served).await;
    World {
        api,
        setup,
        _served: served,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_watch_each_connection_once_and_answer_alike() {
    let world = world().await;
    let (api, setup) = (&world.api, &world.setup);
    let replicas = setup.replicas(3).await;

    // Membership: a row each, live, at the address each advertises.
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT id, advertise_url FROM replicas ORDER BY id")
            .fetch_all(&setup.app.db)
            .await
            .unwrap();
    let mut expected: Vec<_> = replicas
        .iter()
        .map(|r| (r.id.clone(), r.advertise_url.clone()))
        .collect();
    expected.sort();
    assert_eq!(rows, expected);

    let owner = setup.settled_owner(&replicas).await;

    // Its internal listener says so, to another replica only.
    let signed = signed_whoami();
    let (status, body) = whoami(
        &owner.advertise_url,
        &[(envlens::auth::REPLICA_HEADER, &signed)],
    );
    assert_eq!(status, 200, "{body}");
    let me: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(me["id"], owner.id);
    assert_eq!(me["holds"].as_array().map(Vec::len), Some(1), "{me}");
    for other in replicas.iter().filter(|r| r.id != owner.id) {
        let (status, body) = whoami(
            &other.advertise_url,
            &[(envlens::auth::REPLICA_HEADER, &signed)],
        );
        assert_eq!(status, 200, "{body}");
        let them: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(them["holds"], serde_json::json!([]), "{them}");
    }
    let gitlab = internal_token();
    for headers in [
        vec![],
        vec![(envlens::auth::REPLICA_HEADER, gitlab.as_str())],
    ] {
        let (status, _) = whoami(&owner.advertise_url, &headers);
        assert_eq!(status, 401, "{headers:?}");
    }

    // The owner's view starts one watch per kind; the others' views add none.
    let first = production(owner);
    let one_set = settled(api).await;
    assert!(one_set > 0, "the owner watches the namespace");
    for replica in &replicas {
        assert_eq!(production(replica), first, "replica {}", replica.id);
    }
    assert_eq!(settled(api).await, one_set, "one set of watches, not three");
}

/// A TCP relay to the test PostgreSQL that can be cut: open connections closed, new ones
/// refused (its port no longer listens).
struct Relay {
    url: String,
    cut: watch::Sender<bool>,
}

impl Relay {
    async fn to(database: &sqlx::PgPool, url: &str) -> Relay {
        let options = database.connect_options();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = match options.get_socket() {
            Some(dir) => Target::Unix(dir.join(format!(".s.PGSQL.{}", options.get_port()))),
            None => Target::Tcp(format!("{}:{}", options.get_host(), options.get_port())),
        };
        // The same URL with the relay as its host and port, and no socket folder.
        let (scheme, rest) = url.split_once("://").unwrap();
        let (authority, path) = rest.split_once('/').unwrap();
        let credentials = authority.rsplit_once('@').map_or("", |(c, _)| c);
        let at = if credentials.is_empty() { "" } else { "@" };
        let (path, query) = path.split_once('?').unwrap_or((path, ""));
        let query: Vec<&str> = query
            .split('&')
            .filter(|p| !p.is_empty() && !p.starts_with("host="))
            .collect();
        let url = format!(
            "{scheme}://{credentials}{at}127.0.0.1:{port}/{path}{}{}",
            if query.is_empty() { "" } else { "?" },
            query.join("&")
        );
        let (cut, cutting) = watch::channel(false);
        let mut stop = cutting.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = stop.wait_for(|c| *c) => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((mut client, _)) = accepted else {
                    return;
                };
                let target = target.clone();
                let mut stop = cutting.clone();
                tokio::spawn(async move {
                    let relay = async {
                        match target {
                            Target::Unix(path) => {
                                let mut server = tokio::net::UnixStream::connect(path).await?;
                                tokio::io::copy_bidirectional(&mut client, &mut server).await
                            }
                            Target::Tcp(addr) => {
                                let mut server = tokio::net::TcpStream::connect(addr).await?;
                                tokio::io::copy_bidirectional(&mut client, &mut server).await
                            }
                        }
                    };
                    tokio::select! {
                        _ = stop.wait_for(|c| *c) => {}
                        _ = relay => {}
                    }
                });
            }
        });
        Relay { url, cut }
    }

    fn cut(&self) {
        let _ = self.cut.send(true);
    }
}

#[derive(Clone)]
enum Target {
    Unix(std::path::PathBuf),
    Tcp(String),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_cut_from_the_database_stops_watching_before_its_lease_is_taken() {
    let world = world().await;
    let (api, setup) = (&world.api, &world.setup);
    // Bookmarks keep the streams writing: a client gone is noticed at once.
    api.set_bookmark_interval(Duration::from_millis(100));
    let relay = Relay::to(&setup.app.db, &setup.url).await;
    let cut_off = setup.replica(&relay.url).await;
    setup
        .wait_holder("the only replica takes the connection", |h| {
            h.as_ref().is_some_and(|(id, _)| *id == cut_off.id)
        })
        .await;
    let before = production(&cut_off);
    assert!(settled(api).await > 0, "the replica watches the namespace");

    relay.cut();
    let other = setup.replica(&setup.url).await;
    // At every moment: once the other replica holds the lease, no watch of the first one is
    // left open (nobody has read through the new owner yet, so every open stream is the
    // first one's).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let holder = setup.holder().await;
        let open = api.open_streams();
        if holder.as_ref().is_some_and(|(id, _)| *id == other.id) {
            assert_eq!(
                open, 0,
                "the cut-off replica still watched when the lease was taken"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the other replica never took the lease: {holder:?}\n{}",
            other.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        cut_off_is_running(&cut_off),
        "the cut-off replica keeps running"
    );
    // The new owner watches, and answers as the old one did.
    assert_eq!(production(&other), before);
    assert!(
        settled(api).await > 0,
        "the new owner watches the namespace"
    );
}

fn cut_off_is_running(replica: &Replica) -> bool {
    // SAFETY: signal 0 checks that our own child exists.
    unsafe { libc::kill(replica.child.id() as libc::pid_t, 0) == 0 }
}

/// What a replica says it holds now: (connection, generation, term) each; `None` when it does
/// not answer (killed, or stopping).
fn holds(replica: &Replica) -> Option<Vec<(String, u64, u64)>> {
    let signed = signed_whoami();
    let (status, body) = whoami(
        &replica.advertise_url,
        &[(envlens::auth::REPLICA_HEADER, &signed)],
    );
    if status != 200 {
        return None;
    }
    let me: Value = serde_json::from_str(&body).ok()?;
    Some(
        me["holds"]
            .as_array()?
            .iter()
            .map(|h| {
                (
                    h["connection"].as_str().unwrap().to_owned(),
                    h["generation"].as_u64().unwrap(),
                    h["term"].as_u64().unwrap(),
                )
            })
            .collect(),
    )
}

/// One round of the uniqueness check: every replica asked twice, in the same order. A replica
/// that reports the same hold (generation and term: held throughout) both times held the
/// connection at every instant in between, so none of the others asked in between may hold it.
fn check_unique(replicas: &[Replica]) {
    let n = replicas.len();
    let asked: Vec<_> = (0..2 * n).map(|i| holds(&replicas[i % n])).collect();
    for i in 0..n {
        let (Some(first), Some(second)) = (&asked[i], &asked[i + n]) else {
            continue;
        };
        for hold in first.iter().filter(|h| second.contains(h)) {
            for between in &asked[i + 1..i + n] {
                let other = between
                    .iter()
                    .flatten()
                    .find(|(connection, ..)| *connection == hold.0);
                assert!(
                    other.is_none(),
                    "{} held {hold:?} throughout while another replica held {other:?}",
                    replicas[i].id
                );
            }
        }
    }
}

pub(super) fn kill_9(replica: Replica) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(replica.child.id() as libc::pid_t, libc::SIGKILL) };
    drop(replica);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ownership_is_unique_through_starts_stops_and_kills() {
    use rand::{Rng, SeedableRng};
    let world = world().await;
    let (api, setup) = (&world.api, &world.setup);
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut replicas = setup.replicas(1).await;
    let mut checks = 0;
    for _ in 0..8 {
        match rng.random_range(0..3) {
            0 if replicas.len() < 4 => replicas.push(setup.replica(&setup.url).await),
            1 if replicas.len() > 1 => {
                let gone = replicas.remove(rng.random_range(0..replicas.len()));
                // Stopped (SIGTERM) in the background: the others go on being checked.
                std::thread::spawn(move || drop(gone));
            }
            _ if replicas.len() > 1 => kill_9(replicas.remove(rng.random_range(0..replicas.len()))),
            _ => replicas.push(setup.replica(&setup.url).await),
        }
        let until = Instant::now() + Duration::from_millis(rng.random_range(500..4000));
        while Instant::now() < until {
            check_unique(&replicas);
            checks += 1;
        }
    }
    // Whoever is left: the connection owned again by one of them, which says so.
    let owner = setup.settled_owner(&replicas).await;
    check_unique(&replicas);
    assert!(checks > 8, "{checks} checks");
    // And it alone watches: views through every replica add no watches to the owner's.
    production(owner);
    let one_set = settled(api).await;
    assert!(one_set > 0);
    for replica in &replicas {
        production(replica);
    }
    assert_eq!(settled(api).await, one_set, "one set of watches");
}

/// The internal listener is bounded as the public one is: in a pod it listens on every
/// address, so a connection that sends nothing is closed after `--header-read-timeout`
/// instead of being held for as long as its peer likes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_internal_listener_closes_connections_that_send_nothing() {
    let world = world().await;
    let setup = &world.setup;
    let config = setup.config.path().to_str().unwrap();
    let replica = Replica::start_with(
        &setup.url,
        setup.secrets.path(),
        &["--config", config, "--header-read-timeout", "1s"],
    )
    .await;
    let host = replica.advertise_url.strip_prefix("http://").unwrap();
    let mut silent = tokio::net::TcpStream::connect(host).await.unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        use tokio::io::AsyncReadExt;
        loop {
            match silent.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "still open after 20 s");
    assert!(started.elapsed() >= Duration::from_millis(900));
}
