//! GraphQL's connections (`db::lease`): reused as they come back, bounded, recovered after an
//! interrupted statement, closed when discarded.

use std::time::Duration;

use envlens::db::lease::Leases;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::support::postgres::{fresh_database, TestDatabase};

/// Leases of at most `max` connections to a fresh database, waiting 300 ms for one.
async fn leases(max: u32) -> (Leases, TestDatabase) {
    let db = fresh_database().await;
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_millis(300))
        .connect_with((*db.connect_options()).clone())
        .await
        .unwrap();
    (Leases::new(&pool.into()), db)
}

async fn backend(conn: &mut sqlx::PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Backends connected to the test's database, this test's own pool's excepted.
async fn backends(db: &PgPool) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
         ORDER BY pid",
    )
    .fetch_all(db)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_connection_comes_back_and_serves_the_next_request() {
    let (leases, db) = leases(2).await;
    let mut first = leases.acquire().await.unwrap();
    let pid = backend(&mut first).await;
    drop(first);
    let mut again = leases.acquire().await.unwrap();
    assert_eq!(
        backend(&mut again).await,
        pid,
        "the same connection, not a new one"
    );
    // Two at once: a second connection opens beside the first.
    let mut other = leases.acquire().await.unwrap();
    let other_pid = backend(&mut other).await;
    assert_ne!(other_pid, pid);
    drop((again, other));
    // Both stay open while idle, and serve the next requests in turn.
    let open = backends(&db).await;
    assert!(open.contains(&pid) && open.contains(&other_pid), "{open:?}");
    let (mut a, mut b) = (
        leases.acquire().await.unwrap(),
        leases.acquire().await.unwrap(),
    );
    let mut again = [backend(&mut a).await, backend(&mut b).await];
    again.sort();
    let mut before = [pid, other_pid];
    before.sort();
    assert_eq!(again, before);
}

#[tokio::test]
async fn no_more_than_the_maximum_at_once_then_a_timeout() {
    let (leases, _db) = leases(2).await;
    let a = leases.acquire().await.unwrap();
    let _b = leases.acquire().await.unwrap();
    let refused = leases
        .acquire()
        .await
        .err()
        .expect("a third lease waits, then fails");
    assert!(matches!(refused, sqlx::Error::PoolTimedOut), "{refused:?}");
    // One back: the waiting request gets it.
    let waiting = tokio::spawn({
        let leases = leases.clone();
        async move { leases.acquire().await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(a);
    waiting.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_statement_cut_short_leaves_nothing_for_the_next_borrower() {
    let (leases, _db) = leases(1).await;
    let mut lease = leases.acquire().await.unwrap();
    let pid = backend(&mut lease).await;
    // The request is dropped while its statement runs (its client went away).
    let cut = tokio::time::timeout(
        Duration::from_millis(50),
        sqlx::query_scalar::<_, i32>("SELECT 7 FROM pg_sleep(0.3)").fetch_one(&mut *lease),
    )
    .await;
    assert!(cut.is_err(), "the statement was still running");
    drop(lease);
    // The next borrower has the same connection and its own answer, not the rows left over.
    let mut next = leases.acquire().await.unwrap();
    let answer: i32 = sqlx::query_scalar("SELECT 42")
        .fetch_one(&mut *next)
        .await
        .unwrap();
    assert_eq!(answer, 42);
    assert_eq!(backend(&mut next).await, pid);
}

#[tokio::test]
async fn a_connection_past_the_pools_lifetime_is_closed_when_it_comes_back() {
    let db = fresh_database().await;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(Duration::from_millis(200))
        .connect_with((*db.connect_options()).clone())
        .await
        .unwrap();
    let leases = Leases::new(&pool.into());
    let mut lease = leases.acquire().await.unwrap();
    let pid = backend(&mut lease).await;
    drop(lease);
    let mut young = leases.acquire().await.unwrap();
    assert_eq!(backend(&mut young).await, pid, "still young: kept");
    tokio::time::sleep(Duration::from_millis(250)).await;
    drop(young);
    let mut next = leases.acquire().await.unwrap();
    assert_ne!(backend(&mut next).await, pid, "too old: replaced");
}

#[tokio::test]
async fn a_discarded_connection_is_closed_and_replaced() {
    let (leases, db) = leases(1).await;
    let mut lease = leases.acquire().await.unwrap();
    let pid = backend(&mut lease).await;
    lease.discard();
    let mut next = leases.acquire().await.unwrap();
    assert_ne!(backend(&mut next).await, pid, "a new connection");
    // The server ends the discarded connection's backend.
    for _ in 0..100 {
        if !backends(&db).await.contains(&pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("backend {pid} is still connected");
}

#[tokio::test]
async fn a_connection_idle_past_the_pools_idle_timeout_is_closed() {
    let db = fresh_database().await;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .idle_timeout(Duration::from_millis(300))
        .connect_with((*db.connect_options()).clone())
        .await
        .unwrap();
    let leases = Leases::new(&pool.into());
    let (mut busy, mut idle) = (
        leases.acquire().await.unwrap(),
        leases.acquire().await.unwrap(),
    );
    let (busy_pid, idle_pid) = (backend(&mut busy).await, backend(&mut idle).await);
    // `busy` goes back last, so it is on top and serves every request below; `idle` rests.
    drop(idle);
    drop(busy);
    let mut closed = false;
    for _ in 0..100 {
        let mut lease = leases.acquire().await.unwrap();
        assert_eq!(
            backend(&mut lease).await,
            busy_pid,
            "the one in use is kept"
        );
        drop(lease);
        if !backends(&db).await.contains(&idle_pid) {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(closed, "backend {idle_pid} is still connected after 5s");
    // Without a single request, the other goes the same way.
    for _ in 0..100 {
        if !backends(&db).await.contains(&busy_pid) {
            // And a new request opens a new one.
            let mut next = leases.acquire().await.unwrap();
            assert!(![busy_pid, idle_pid].contains(&backend(&mut next).await));
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "backend {busy_pid} is still connected after 5s idle: {:?}",
        backends(&db).await
    );
}

/// A server out of connection slots (SQLSTATE 53300, here a role's `CONNECTION LIMIT`) while
/// the stack holds others: the request waits for one of them, and the database is not taken
/// for down. With none of the stack's own to wait for, the refusal is the request's answer.
#[tokio::test]
async fn a_server_out_of_slots_means_waiting_for_a_lease_not_an_outage() {
    let db = fresh_database().await;
    let admin = PgPool::connect_with((*db.connect_options()).clone())
        .await
        .unwrap();
    // Roles are the server's, not the database's: named for the test's database.
    let role: String = sqlx::query_scalar("SELECT 'lim_' || current_database()")
        .fetch_one(&admin)
        .await
        .unwrap();
    sqlx::query(&format!(
        "CREATE ROLE \"{role}\" LOGIN NOSUPERUSER CONNECTION LIMIT 2"
    ))
    .execute(&admin)
    .await
    .unwrap();
    let options = (*db.connect_options()).clone().username(&role);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options);
    let gate: envlens::db::pool::Pool = pool.into();
    let leases = Leases::with_max(&gate, 8);

    let mut a = leases.acquire().await.unwrap();
    let b = leases.acquire().await.unwrap();
    let pid = backend(&mut a).await;
    // The role's two slots are taken: the third waits for one of the two, not an error.
    let waiting = tokio::spawn({
        let leases = leases.clone();
        async move {
            let mut lease = leases.acquire().await?;
            Ok::<_, sqlx::Error>(backend(&mut lease).await)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "it waits for a lease");
    drop(a);
    assert_eq!(waiting.await.unwrap().unwrap(), pid, "the lease given back");
    assert!(!gate.is_down(), "a full server is not a server down");

    // Without a lease of its own out, the refusal is the answer, and still not an outage.
    drop((b, leases));
    // The stack's connections closed with it; their backends end a moment later.
    let role_backends = format!("SELECT count(*) FROM pg_stat_activity WHERE usename = '{role}'");
    while sqlx::query_scalar::<_, i64>(&role_backends)
        .fetch_one(&admin)
        .await
        .unwrap()
        > 0
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let others = PgPool::connect_with((*db.connect_options()).clone().username(&role))
        .await
        .unwrap();
    let _held = (
        others.acquire().await.unwrap(),
        others.acquire().await.unwrap(),
    );
    let fresh = Leases::with_max(&gate, 8);
    let refused = fresh.acquire().await.err().expect("no slot, no lease out");
    assert!(
        matches!(&refused, sqlx::Error::Database(e) if e.code().as_deref() == Some("53300")),
        "{refused:?}"
    );
    // The refusal had the gate probe the server, which answered with no slot: up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!gate.is_down(), "a full server is not a server down");
    drop(_held);
    others.close().await;
    drop(fresh);
    gate.pg().close().await;
    sqlx::query(&format!("DROP ROLE \"{role}\""))
        .execute(&admin)
        .await
        .ok();
}
