//! The connection leases in PostgreSQL (SPEC 16, `db::replicas`): one holder at a time, taken
//! only once expired by the database's clock, a generation that moves on at every take and is
//! kept through a release, and a renewal that fails once another replica took the lease.

use std::time::Duration;

use envlens::db::replicas::{heartbeat, live, release, renew, take, Member};

use crate::support::postgres;

const C: &str = "context \"test\" of /etc/envlens/kubeconfig";

#[tokio::test]
async fn a_lease_has_one_holder_and_its_generation_only_grows() {
    let db = postgres::fresh_database().await;
    let long = Duration::from_secs(60);
    assert_eq!(take(&*db, C, "a", long).await.unwrap(), Some(1));
    // Held and not expired: nobody else takes it; its holder renews it.
    assert_eq!(take(&*db, C, "b", long).await.unwrap(), None);
    let held = [C.to_owned()];
    assert_eq!(
        renew(&*db, "a", &held, long).await.unwrap(),
        [(C.to_owned(), 1)]
    );
    assert!(renew(&*db, "b", &held, long).await.unwrap().is_empty());
    // Released: taken at once by another, with the next generation; the old holder's renewal
    // fails from then on.
    release(&*db, "a", Some(&held[..])).await.unwrap();
    assert_eq!(take(&*db, C, "b", long).await.unwrap(), Some(2));
    assert!(renew(&*db, "a", &held, long).await.unwrap().is_empty());
    // Expired without a release: taken again, never renewed by the one it ran out on.
    let short = Duration::from_millis(200);
    assert_eq!(renew(&*db, "b", &held, short).await.unwrap().len(), 1);
    assert_eq!(take(&*db, C, "a", long).await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(renew(&*db, "b", &held, long).await.unwrap().is_empty());
    assert_eq!(take(&*db, C, "a", long).await.unwrap(), Some(3));
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
