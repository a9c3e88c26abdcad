//! A real PostgreSQL for the tests, one fresh database per test.
//!
//! With `DATABASE_URL` set, databases are created on that server. Without it, the test
//! process starts a private server from the machine's PostgreSQL binaries (the same code as
//! `envlens serve`'s embedded default, with `fsync=off`) in a temporary folder. Either way
//! the migrations run once, into a template that each test's database is copied from.
//!
//! A test's database `envlens_test_<pid>_<n>` is dropped when the test lets go of it, and
//! whatever is left of this process (the template, a database a test leaked) when the process
//! exits. A process killed before that leaves its databases behind: the next test process on
//! the same server drops those whose pid is no longer alive (on this machine: share one
//! `DATABASE_URL` server between machines only with separate roles or servers).

use std::ops::Deref;
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

pub async fn admin_connection() -> PgConnection {
    let options = server().admin.clone().disable_statement_logging();
    PgConnection::connect_with(&options)
        .await
        .expect("cannot connect to the test PostgreSQL")
}

/// A new, migrated, empty database for one test, dropped with the value.
pub async fn fresh_database() -> TestDatabase {
    let server = server();
    TEMPLATE
        .get_or_init(|| async {
            let mut conn = admin_connection().await;
            drop_leftovers(&mut conn).await;
            if server._embedded.is_none() {
                // A private server goes with its folder; a shared one keeps what is not dropped.
                // SAFETY: registers a plain `extern "C" fn` to run at exit.
                unsafe { libc::atexit(drop_this_process_databases) };
            }
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
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(server.admin.clone().database(&name))
        .await
        .expect("cannot connect to the test database");
    TestDatabase { pool, name }
}

/// A test's database: its pool, and the database dropped when this goes (the test's end).
pub struct TestDatabase {
    pool: PgPool,
    name: String,
}

impl TestDatabase {
    /// A `postgres://` URL of this database, for a command run by the test.
    pub fn url(&self) -> String {
        match std::env::var("DATABASE_URL") {
            Ok(url) => {
                let mut url = url::Url::parse(&url).expect("DATABASE_URL is a URL");
                url.set_path(&self.name);
                url.to_string()
            }
            Err(_) => server()
                .admin
                .clone()
                .database(&self.name)
                .to_url_lossy()
                .to_string(),
        }
    }
}

impl Deref for TestDatabase {
    type Target = PgPool;
    fn deref(&self) -> &PgPool {
        &self.pool
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // Drop is not async and the test's runtime is busy dropping us: the statement runs on a
        // runtime of its own. `WITH (FORCE)` (PostgreSQL 13) ends the pool's connections, which
        // tasks the test spawned may still hold.
        let sql = format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_ident(&self.name)
        );
        let dropped = std::thread::spawn(move || block_on(admin_execute(vec![sql]))).join();
        if let Ok(Err(e)) = dropped {
            eprintln!("cannot drop test database {}: {e}", self.name);
        }
    }
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

async fn admin_execute(statements: Vec<String>) -> Result<(), sqlx::Error> {
    let options = server().admin.clone().disable_statement_logging();
    let mut conn = PgConnection::connect_with(&options).await?;
    for sql in statements {
        sqlx::raw_sql(&sql).execute(&mut conn).await?;
    }
    conn.close().await
}

/// At exit: the template and any database of this process a test did not drop.
extern "C" fn drop_this_process_databases() {
    let pid = std::process::id();
    let dropped = std::thread::spawn(move || {
        block_on(async move {
            let mut conn = admin_connection().await;
            let statements = ours(&mut conn, |p| p == pid).await;
            conn.close().await.ok();
            admin_execute(statements).await
        })
    })
    .join();
    if let Ok(Err(e)) = dropped {
        eprintln!("cannot drop the test databases of process {pid}: {e}");
    }
}

/// Databases of test processes that are gone (killed before they could drop their own).
pub async fn drop_leftovers(conn: &mut PgConnection) {
    // SAFETY: signal 0 only checks that the process exists.
    let dead = |pid: u32| unsafe { libc::kill(pid as i32, 0) } != 0;
    for sql in ours(conn, dead).await {
        if let Err(e) = sqlx::raw_sql(&sql).execute(&mut *conn).await {
            eprintln!("cannot drop a leftover test database ({sql}): {e}");
        }
    }
}

/// `DROP DATABASE` statements for the test databases and templates of the pids `which` picks.
async fn ours(conn: &mut PgConnection, which: impl Fn(u32) -> bool) -> Vec<String> {
    let names: Vec<String> = sqlx::query_scalar(
        r"SELECT datname FROM pg_database
          WHERE datname LIKE 'envlens\_test\_%' OR datname LIKE 'envlens\_template\_%'",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("cannot list the test databases");
    names
        .into_iter()
        .filter(|name| test_database_pid(name).is_some_and(&which))
        .map(|name| {
            format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                quote_ident(&name)
            )
        })
        .collect()
}

/// The pid in `envlens_test_<pid>_<n>` or `envlens_template_<pid>`.
fn test_database_pid(name: &str) -> Option<u32> {
    if let Some(rest) = name.strip_prefix("envlens_test_") {
        let (pid, n) = rest.split_once('_')?;
        n.parse::<u64>().ok()?;
        return pid.parse().ok();
    }
    name.strip_prefix("envlens_template_")?.parse().ok()
}
