//! The tests' own databases (`support::postgres`): dropped at a test's end, and those of dead
//! test processes dropped by the next one.

use sqlx::PgPool;

use crate::support::postgres::{admin_connection, drop_leftovers, fresh_database};
use envlens::db::embedded::quote_ident;

async fn exists(db: &PgPool, name: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_tests_database_is_dropped_when_the_test_lets_go_of_it() {
    let observer = fresh_database().await;
    let db = fresh_database().await;
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&*db)
        .await
        .unwrap();
    assert!(
        name.starts_with(&format!("envlens_test_{}_", std::process::id())),
        "{name}"
    );
    // A connection still open (a task the test spawned may hold one) does not keep it.
    let _held = db.acquire().await.unwrap();
    assert!(exists(&observer, &name).await);
    drop(db);
    assert!(!exists(&observer, &name).await, "{name} is still there");
}

#[tokio::test]
async fn databases_of_dead_test_processes_are_dropped() {
    let observer = fresh_database().await;
    // A pid that was alive a moment ago and is not any more.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let ours = std::process::id();
    // pid 1 is alive as long as the machine: its databases stay.
    let names = [
        (format!("envlens_test_{dead}_{ours}"), false),
        (format!("envlens_template_{dead}"), false),
        (format!("envlens_test_1_{ours}"), true),
        // Not named like ours: not ours to drop.
        (format!("envlens_test_{dead}_x{ours}"), true),
    ];
    let mut conn = admin_connection().await;
    for (name, _) in &names {
        sqlx::raw_sql(&format!("CREATE DATABASE {}", quote_ident(name)))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    drop_leftovers(&mut conn).await;
    for (name, stays) in &names {
        assert_eq!(exists(&observer, name).await, *stays, "{name}");
        let sql = format!("DROP DATABASE IF EXISTS {}", quote_ident(name));
        sqlx::raw_sql(&sql).execute(&mut conn).await.unwrap();
    }
}
