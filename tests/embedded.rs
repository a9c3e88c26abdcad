//! The embedded PostgreSQL of `envlens serve`: attaching to a running one, and a data folder
//! the server's user cannot reach.

use std::os::unix::fs::PermissionsExt;

use envlens::db::embedded::{EmbeddedPostgres, Options};
use sqlx::{Connection, PgConnection};

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
