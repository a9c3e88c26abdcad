//! A real PostgreSQL for the tests, one fresh database per test.
//!
//! With `DATABASE_URL` set, databases are created on that server. Without it, the test
//! process starts a private server from the machine's PostgreSQL binaries (the same code as
//! `envlens serve`'s embedded default, with `fsync=off`) in a temporary folder. Either way
//! the migrations run once, into a template that each test's database is copied from.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use envlens::db::embedded::{quote_ident, EmbeddedPostgres, Options};
use envlens::db::MIGRATOR;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tokio::sync::OnceCell;

struct Server {
    /// Options for the maintenance database; per-test ones change only the database name.
    admin: PgConnectOptions,
    template: String,
    /// Keeps the private server running (it also dies with the process).
    _embedded: Option<EmbeddedPostgres>,
}

static SERVER: OnceLock<Server> = OnceLock::new();
static TEMPLATE: OnceCell<()> = OnceCell::const_new();
static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn server() -> &'static Server {
    SERVER.get_or_init(|| {
        let pid = std::process::id();
        let template = format!("envlens_template_{pid}");
        match std::env::var("DATABASE_URL") {
            Ok(url) => Server {
                admin: PgConnectOptions::from_str(&url)
                    .expect("DATABASE_URL is not a PostgreSQL URL"),
                template,
                _embedded: None,
            },
            Err(_) => {
                remove_stale_folders();
                let dir = folder_for(pid);
                let pg = EmbeddedPostgres::start(
                    &dir,
                    &Options {
                        bin_dir: None,
                        ephemeral: true,
                    },
                )
                .expect("cannot start the private test PostgreSQL");
                Server {
                    admin: pg.connect_options("postgres"),
                    template,
                    _embedded: Some(pg),
                }
            }
        }
    })
}

fn folder_for(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("envlens-test-{pid}"))
}

/// Folders of test processes that have exited (their servers died with them).
fn remove_stale_folders() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("envlens-test-")) else {
            continue;
        };
        let alive = pid
            .parse::<i32>()
            .is_ok_and(|pid| unsafe { libc::kill(pid, 0) } == 0);
        if !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

async fn admin_connection() -> PgConnection {
    let options = server().admin.clone().disable_statement_logging();
    PgConnection::connect_with(&options)
        .await
        .expect("cannot connect to the test PostgreSQL")
}

/// A new, migrated, empty database for one test.
pub async fn fresh_database() -> PgPool {
    let server = server();
    TEMPLATE
        .get_or_init(|| async {
            let mut conn = admin_connection().await;
            for sql in ["DROP DATABASE IF EXISTS", "CREATE DATABASE"] {
                let sql = format!("{sql} {}", quote_ident(&server.template));
                sqlx::raw_sql(&sql)
                    .execute(&mut conn)
                    .await
                    .expect("cannot create the template database");
            }
            let mut template =
                PgConnection::connect_with(&server.admin.clone().database(&server.template))
                    .await
                    .expect("cannot connect to the template database");
            MIGRATOR.run(&mut template).await.expect("migrations fail");
            template.close().await.ok();
            conn.close().await.ok();
        })
        .await;
    let name = format!(
        "envlens_test_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let mut conn = admin_connection().await;
    sqlx::raw_sql(&format!(
        "CREATE DATABASE {} TEMPLATE {}",
        quote_ident(&name),
        quote_ident(&server.template)
    ))
    .execute(&mut conn)
    .await
    .expect("cannot create a test database");
    conn.close().await.ok();
    // Statements are logged (at debug, to no subscriber unless a test installs one): the
    // GraphQL tests count them.
    PgPoolOptions::new()
        .max_connections(8)
        .connect_with(server.admin.clone().database(&name))
        .await
        .expect("cannot connect to the test database")
}
