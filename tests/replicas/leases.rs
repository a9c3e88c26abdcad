//! The connection leases in PostgreSQL (SPEC 16, `db::replicas`): one holder at a time, taken
//! only once expired by the database's clock, a generation that moves on at every take and is
//! kept through a release, and a renewal that fails once another replica took the lease.

use std::time::Duration;

use envlens::db::replicas::{heartbeat, live, release, renew, take_all, Member};

use crate::support::postgres;

const C: &str = "context \"test\" of /etc/envlens/kubeconfig";

/// The lease of `connection` taken for `replica`: its generation, `None` when held.
async fn take(db: &sqlx::PgPool, connection: &str, replica: &str, ttl: Duration) -> Option<i64> {
    let taken = take_all(db, &[connection.to_owned()], replica, ttl)
        .await
        .unwrap();
    assert!(taken.iter().all(|(c, _)| c == connection));
    taken.first().map(|(_, generation)| *generation)
}

#[tokio::test]
async fn a_lease_has_one_holder_and_its_generation_only_grows() {
    let db = postgres::fresh_database().await;
    let long = Duration::from_secs(60);
    assert_eq!(take(&db, C, "a", long).await, Some(1));
    // Held and not expired: nobody else takes it; its holder renews it.
    assert_eq!(take(&db, C, "b", long).await, None);
    let held = [C.to_owned()];
    assert_eq!(
        renew(&*db, "a", &held, long).await.unwrap(),
        [(C.to_owned(), 1)]
    );
    assert!(renew(&*db, "b", &held, long).await.unwrap().is_empty());
    // Released: taken at once by another, with the next generation; the old holder's renewal
    // fails from then on.
    release(&*db, "a", Some(&held[..])).await.unwrap();
    assert_eq!(take(&db, C, "b", long).await, Some(2));
    assert!(renew(&*db, "a", &held, long).await.unwrap().is_empty());
    // Expired without a release: taken again, never renewed by the one it ran out on.
    let short = Duration::from_millis(200);
    assert_eq!(renew(&*db, "b", &held, short).await.unwrap().len(), 1);
    assert_eq!(take(&db, C, "a", long).await, None);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(renew(&*db, "b", &held, long).await.unwrap().is_empty());
    assert_eq!(take(&db, C, "a", long).await, Some(3));
    // Several at once: only those nobody holds are taken.
    let (d, e) = (format!("{C} d"), format!("{C} e"));
    assert_eq!(take(&db, &d, "b", long).await, Some(1));
    let asked = [C.to_owned(), d.clone(), e.clone()];
    assert_eq!(
        take_all(&*db, &asked, "a", long).await.unwrap(),
        [(e.clone(), 1)]
    );
    // Releasing all of a replica's leases touches no other's.
    release(&*db, "b", None).await.unwrap();
    assert_eq!(renew(&*db, "a", &held, long).await.unwrap().len(), 1);
}

#[tokio::test]
async fn the_live_set_is_who_beat_within_the_window() {
    let db = postgres::fresh_database().await;
    heartbeat(&*db, "b", "http://10.0.0.2:8081").await.unwrap();
    heartbeat(&*db, "a", "http://10.0.0.1:8081").await.unwrap();
    let both = live(&*db, Duration::from_secs(10)).await.unwrap();
    let ids: Vec<&str> = both.iter().map(|m: &Member| m.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    heartbeat(&*db, "a", "http://10.0.0.9:8081").await.unwrap();
    let one = live(&*db, Duration::from_secs(1)).await.unwrap();
    assert_eq!(
        one,
        [Member {
            id: "a".into(),
            advertise_url: "http://10.0.0.9:8081".into()
        }]
    );
}

/// Under a database slow to take leases (the first takes of a thousand connections, here a
/// row another session holds locked), the leases already held are still renewed and granted
/// at every step: their watches never stop. The take waits for the lock and goes through once
/// it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_that_hangs_does_not_let_the_leases_held_run_out() {
    use envlens::k8s::watch::fence::Fences;
    use envlens::replicas::Ownership;
    use sqlx::Connection;

    let db = postgres::fresh_database().await;
    // Room for the steps cut short while their take waits on the lock.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(40)
        .connect_with((*db.connect_options()).clone())
        .await
        .unwrap();
    let window = Duration::from_secs(2);
    let fences = Fences::shared();
    let (b, c) = (fences.fence("b"), fences.fence("c"));
    let ownership = Ownership::new(pool, fences.clone(), "http://127.0.0.1:1".into(), window);
    ownership.join().await.unwrap();
    let run = tokio::spawn(ownership.run());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while b.term().is_none() || c.term().is_none() {
        assert!(std::time::Instant::now() < deadline, "never held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let terms = (b.term(), c.term());

    // "a" (first in the steps' order) is free but locked by another session.
    sqlx::query(
        "INSERT INTO connection_leases (connection, replica, generation, expires_at)
         VALUES ('a', 'gone', 1, now())",
    )
    .execute(&*db)
    .await
    .unwrap();
    let mut locker = sqlx::PgConnection::connect_with(&db.connect_options())
        .await
        .unwrap();
    let mut tx = locker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM connection_leases WHERE connection = 'a' FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let a = fences.fence("a");
    // Longer than a hold lasts without a renewal (4/5 of the window), twice over.
    let locked = std::time::Instant::now();
    while locked.elapsed() < window * 2 {
        assert_eq!(
            (b.term(), c.term()),
            terms,
            "a lease held ran out while a take waited"
        );
        assert_eq!(a.term(), None);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.rollback().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while a.term().is_none() {
        assert!(std::time::Instant::now() < deadline, "not taken once free");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!((b.term(), c.term()), terms);
    run.abort();
}
