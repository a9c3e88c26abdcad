//! The embedded PostgreSQL of `envlens serve`: attaching to a running one, a data folder the
//! server's user cannot reach, and a server killed under load.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, Request};
use clap::Parser;
use envlens::config::{Cli, Command, DatabaseArgs, Limits};
use envlens::db::embedded::{EmbeddedPostgres, Options};
use envlens::db::Database;
use envlens::state::AppState;
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};

use crate::support::{keys, TestApp};

fn options() -> Options {
    Options {
        bin_dir: None,
        ephemeral: true,
    }
}

async fn select_one(pg: &EmbeddedPostgres) -> i32 {
    let mut conn = PgConnection::connect_with(&pg.connect_options("postgres"))
        .await
        .unwrap();
    sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_second_start_attaches_to_the_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let first = EmbeddedPostgres::start(dir.path(), &options()).unwrap();
    assert!(first.owns_server());
    let second = EmbeddedPostgres::start(dir.path(), &options()).unwrap();
    assert!(!second.owns_server());
    assert_eq!(select_one(&second).await, 1);
    // Dropping the attached handle leaves the server running.
    drop(second);
    assert_eq!(select_one(&first).await, 1);
    first.stop();
    let again = EmbeddedPostgres::start(dir.path(), &options()).unwrap();
    assert!(
        again.owns_server(),
        "the server was stopped, so a new one starts"
    );
}

#[tokio::test]
async fn a_data_folder_the_server_user_cannot_reach() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "not root: PostgreSQL runs as this user, so every folder it can create is reachable"
        );
        return;
    }
    // A private folder, as `mktemp -d` or a home under /root makes: postgres cannot enter it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let pg = EmbeddedPostgres::start(dir.path(), &options()).unwrap();
    assert!(
        pg.pgdata().starts_with("/var/lib/envlens"),
        "{}",
        pg.pgdata().display()
    );
    assert_eq!(select_one(&pg).await, 1);
    let cluster = pg.pgdata().parent().unwrap().to_owned();
    pg.stop();
    // The same data folder finds the same cluster again.
    let pg = EmbeddedPostgres::start(dir.path(), &options()).unwrap();
    assert_eq!(pg.pgdata().parent().unwrap(), cluster);
    pg.stop();
    std::fs::remove_dir_all(cluster).unwrap();
}

/// `serve`'s settings for a data folder (the embedded server whatever `DATABASE_URL` says).
pub(crate) fn serve_args(dir: &Path) -> DatabaseArgs {
    let cli = Cli::try_parse_from(
        ["envlens", "serve", "--data-dir"]
            .map(OsStr::new)
            .into_iter()
            .chain([dir.as_os_str()]),
    )
    .unwrap();
    let Command::Serve(serve) = cli.command else {
        unreachable!("parsed as serve")
    };
    DatabaseArgs {
        database_url: None,
        ..serve.database
    }
}

/// A deployment creation through agent 7 (configured below), as GitLab sends it.
fn creation(id: i64) -> Value {
    json!({
        "deployment": {"id": id, "iid": id, "status": "created", "ref": "main", "sha": "0a1b2c3d4e5f",
                       "tag": false, "created_at": "2026-11-21T10:00:00Z"},
        "project": {"id": 11, "full_path": "acme/app"},
        "environment": {"id": 9, "name": "production", "slug": "production", "tier": "production"},
        "job": {"id": id, "name": "deploy", "protected_ref": true, "user_id": 3},
        "kubernetes": {"agent": "acme/agents:prod", "namespace": "shop"}
    })
}

async fn setup(app: &TestApp) {
    let res = app
        .internal(
            Method::PUT,
            "/api/v4/internal/identity",
            &json!({
                "groups": [{"id": 1, "full_path": "acme"}],
                "projects": [{"id": 10, "full_path": "acme/agents", "visibility": "private"},
                             {"id": 11, "full_path": "acme/app", "visibility": "private"}]
            }),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let agent = json!({"project_id": 10, "name": "prod"});
    let res = app
        .internal(Method::PUT, "/api/v4/internal/kubernetes/agents/7", &agent)
        .await;
    assert_eq!(res.status, 201, "{}", res.text());
    let config =
        json!({"agent_id": 7, "agent_config": {"ci_access": {"groups": [{"id": "acme"}]}}});
    let res = app
        .internal(
            Method::POST,
            "/api/v4/internal/kubernetes/agent_configuration",
            &config,
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(
        app.internal(Method::POST, DEPLOYMENTS, &creation(1))
            .await
            .status,
        201
    );
}

const DEPLOYMENTS: &str = "/api/v4/internal/deployments";

/// One answered request: when it was sent and answered, relative to the test's start.
struct Answer {
    id: i64,
    status: u16,
    sent: Duration,
    answered: Duration,
}

/// `kill -9` of the postmaster under a load of deployment creations: envlens restarts it,
/// readiness is back within 5 s, every request in between is a success or a 503 answered
/// within 100 ms once the failure is known, and every acknowledged creation is in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_postgres_is_restarted_and_nothing_acknowledged_is_lost() {
    const WORKERS: i64 = 4;
    // In memory where there is a tmpfs: after a crash PostgreSQL syncs the file system before
    // it accepts a connection, and on a disk shared with busy neighbours that alone takes
    // seconds. Here the restart is measured, not the neighbours' writes.
    let shm = Path::new("/dev/shm");
    let dir = match shm.is_dir() {
        true => tempfile::tempdir_in(shm).unwrap(),
        false => tempfile::tempdir().unwrap(),
    };
    // Reachable by the `postgres` user when the tests run as root.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let database = Database::open(&serve_args(dir.path())).await.unwrap();
    let pgdata = database.embedded.as_ref().unwrap().pgdata().to_owned();
    assert!(pgdata.starts_with(dir.path()), "{}", pgdata.display());
    let pool = database.pool.clone();
    let state = AppState::new(pool.clone(), keys(), Limits::default());
    database.register_metrics(&state.metrics);
    let reads = state.reads.clone();
    let app = Arc::new(TestApp::serving(state, pool.pg().clone()));
    setup(&app).await;
    // GraphQL's own connections: one opened now rests on their stack through the outage.
    let mut lease = reads.acquire().await.unwrap();
    sqlx::query("SELECT 1").execute(&mut *lease).await.unwrap();
    drop(lease);

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (app, stop) = (app.clone(), stop.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                // Bounded: a few thousand requests at most, whatever the machine.
                for n in 0..5_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let id = 1_000_000 * (w + 1) + n;
                    let sent = start.elapsed();
                    let res = app.internal(Method::POST, DEPLOYMENTS, &creation(id)).await;
                    let answered = start.elapsed();
                    answers.push(Answer {
                        id,
                        status: res.status.as_u16(),
                        sent,
                        answered,
                    });
                    // 503s come fast: do not spin on them.
                    if res.status == 503 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                answers
            })
        })
        .collect();
    // The outage as envlens saw it: the first moment its pool knew the database was down,
    // and the last moment it still said so.
    let outage = tokio::spawn({
        let (pool, stop) = (pool.clone(), stop.clone());
        async move {
            let mut seen: Option<(Duration, Duration)> = None;
            while !stop.load(Ordering::Relaxed) {
                let now = start.elapsed();
                match (pool.is_down(), seen) {
                    (true, None) => seen = Some((now, now)),
                    (true, Some((known, _))) => seen = Some((known, now)),
                    (false, Some(seen)) => return Some(seen),
                    (false, None) => {}
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            None
        }
    });

    // Under load for a moment, then the postmaster is killed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = database.embedded.as_ref().unwrap().pid().expect("running");
    let killed_at = start.elapsed();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);

    // Readiness is back within 5 seconds (polled; each poll bounded by its own 2 s), once
    // envlens knew of the outage. Meanwhile GraphQL's connections are refused at once too.
    let mut ready_after = None;
    let mut leases_refused = false;
    while start.elapsed() < killed_at + Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if pool.is_down() && !leases_refused {
            let asked = Instant::now();
            let refused = reads.acquire().await.err().expect("no lease while down");
            assert!(asked.elapsed() <= Duration::from_millis(100), "{refused}");
            leases_refused = true;
        }
        let res = app
            .send(Request::get("/-/readiness").body(Body::empty()).unwrap())
            .await;
        if res.status == 200 && pool.outages() > 0 {
            ready_after = Some(start.elapsed() - killed_at);
            break;
        }
    }
    assert!(leases_refused, "the outage was never seen from the test");
    let Some(ready_after) = ready_after else {
        let log = std::fs::read_to_string(dir.path().join("postgres.log")).unwrap_or_default();
        panic!("readiness not back within 5 s of the kill; PostgreSQL's log:\n{log}");
    };
    // A lease is a connection to the new server, not the one that rested through the outage.
    let mut lease = reads.acquire().await.unwrap();
    sqlx::query("SELECT 1").execute(&mut *lease).await.unwrap();
    drop(lease);
    // The load goes on for a while on the new server.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (known, still_down) = outage
        .await
        .unwrap()
        .expect("the failure never became known");
    let mut answers = Vec::new();
    for worker in workers {
        answers.extend(worker.await.unwrap());
    }
    eprintln!(
        "{} requests; the failure known {:?} after the kill, the database back {:?} after; \
         ready again {ready_after:?} after",
        answers.len(),
        known.saturating_sub(killed_at),
        still_down.saturating_sub(killed_at),
    );

    // Every answer is a success or a 503; every 503 comes within 100 ms once the failure is
    // known, and so does every answer to a request sent (or still waiting) while it was
    // known, up to a margin before envlens saw the database back (a request then may find the
    // gate open, and take a new connection's time).
    let fast = Duration::from_millis(100);
    let mut unavailable = 0;
    for a in &answers {
        match a.status {
            200 | 201 => {}
            503 => unavailable += 1,
            other => panic!("deployment {}: {other}", a.id),
        }
        let waited = a.answered.saturating_sub(a.sent.max(known));
        let during = a.answered > known && a.sent + fast < still_down;
        if a.status == 503 || during {
            assert!(
                waited <= fast,
                "deployment {}: {} after {waited:?} once the failure was known",
                a.id,
                a.status
            );
        }
    }
    assert!(
        unavailable > 0,
        "no request met the outage: the test tested nothing"
    );
    let after = answers
        .iter()
        .filter(|a| a.sent > killed_at + ready_after && a.status < 300)
        .count();
    assert!(after > 0, "no creation succeeded after the restart");

    // Nothing acknowledged is lost.
    let acknowledged: Vec<i64> = answers
        .iter()
        .filter(|a| a.status < 300)
        .map(|a| a.id)
        .collect();
    let stored: Vec<i64> = sqlx::query_scalar("SELECT id FROM deployments WHERE id = ANY($1)")
        .bind(&acknowledged)
        .fetch_all(pool.pg())
        .await
        .unwrap();
    let stored: HashSet<i64> = stored.into_iter().collect();
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|id| !stored.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged deployments lost: {lost:?}",
        lost.len()
    );

    // The restart is counted, and the database reported up again.
    let metrics = app
        .send(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .text();
    let restarts: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("envlens_postgres_restarts_total "))
        .expect("the restart counter")
        .parse()
        .unwrap();
    assert!(restarts >= 1, "{metrics}");
    assert!(metrics.contains("\nenvlens_database_up 1\n"), "{metrics}");

    drop(app);
    database.close().await;
}

/// A database envlens did not start (`DATABASE_URL`) that goes away: a failed connect makes
/// the outage known, requests then fail at once, and a probe opens the gate when it is back.
#[tokio::test]
async fn a_database_url_server_that_goes_away_is_known_down_until_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = EmbeddedPostgres::start(dir.path(), &options()).unwrap();
    let mut args = serve_args(dir.path());
    args.database_url = Some(server.url("postgres"));
    let database = Database::open(&args).await.unwrap();
    let pool = database.pool.clone();
    let select_one = || async {
        let mut conn = pool.acquire().await?;
        sqlx::query("SELECT 1").execute(&mut *conn).await
    };
    select_one().await.unwrap();
    let socket = server
        .connect_options("postgres")
        .get_socket()
        .unwrap()
        .join(".s.PGSQL.5432");
    server.stop();
    // A socket nobody listens on: connections are refused, which sqlx's pool retries until
    // the acquire timeout (3 s).
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());

    let gone = Instant::now();
    let mut first = None;
    while !pool.is_down() {
        assert!(gone.elapsed() < Duration::from_secs(5), "never known down");
        let asked = Instant::now();
        assert!(select_one().await.is_err(), "the server is gone");
        first.get_or_insert(asked.elapsed());
    }
    let first = first.unwrap();
    assert!(
        first < Duration::from_secs(1),
        "the first request waited {first:?}"
    );
    for _ in 0..10 {
        let asked = Instant::now();
        assert!(select_one().await.is_err());
        assert!(
            asked.elapsed() <= Duration::from_millis(100),
            "{:?}",
            asked.elapsed()
        );
    }
    let ready = app_ready(&pool).await;
    assert_eq!(ready, 503);

    std::fs::remove_file(&socket).unwrap();
    let server = EmbeddedPostgres::start(dir.path(), &options()).unwrap();
    let back = Instant::now();
    while pool.is_down() {
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "never known up again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The connection opened before the outage is not lent again: the first request succeeds.
    select_one().await.unwrap();
    assert_eq!(app_ready(&pool).await, 200);
    database.close().await;
    server.stop();
}

/// `/-/readiness` of an app over `pool`.
async fn app_ready(pool: &envlens::db::pool::Pool) -> u16 {
    let state = AppState::new(pool.clone(), keys(), Limits::default());
    let app = TestApp::serving(state, pool.pg().clone());
    let res = app
        .send(Request::get("/-/readiness").body(Body::empty()).unwrap())
        .await;
    res.status.as_u16()
}
