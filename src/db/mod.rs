//! The database: connecting (or starting the embedded server), migrations, and the SQL of
//! each aggregate in its own module.

pub mod agents;
pub mod deliveries;
pub mod deployments;
pub mod embedded;
pub mod environment_settings;
pub mod events;
pub mod flux_actions;
pub mod followups;
pub mod health;
pub mod history;
pub mod identity;
pub mod lease;
pub mod live;
pub mod pool;
pub mod pull;
pub mod read;
pub mod read_agents;
pub mod replicas;
pub mod sessions;
pub mod slots;
pub mod sync;
pub mod watch_tokens;

use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::config::DatabaseArgs;
use crate::telemetry::{MetricKind, Metrics};
use embedded::EmbeddedPostgres;
use pool::Pool;

pub static MIGRATOR: Migrator = sqlx::migrate!();

/// The name of envlens' database inside the embedded server.
pub const DATABASE: &str = "envlens";

/// The pool, and the embedded server behind it when envlens started one.
pub struct Database {
    pub pool: Pool,
    pub embedded: Option<EmbeddedPostgres>,
}

impl Database {
    /// Connects to `DATABASE_URL`, or starts the embedded server in the data folder, then
    /// applies the migrations.
    pub async fn open(args: &DatabaseArgs) -> anyhow::Result<Self> {
        let (options, embedded) = match &args.database_url {
            Some(url) => {
                let options = PgConnectOptions::from_str(url)
                    .context("DATABASE_URL is not a valid PostgreSQL URL")?;
                (options, None)
            }
            None => {
                let data_dir = args.data_dir.clone();
                let options = embedded::Options {
                    bin_dir: args.postgres_bin_dir.clone(),
                    ephemeral: false,
                };
                let pg = tokio::task::spawn_blocking(move || {
                    EmbeddedPostgres::start(&data_dir, &options)
                })
                .await??;
                pg.ensure_database(DATABASE).await?;
                (pg.connect_options(DATABASE), Some(pg))
            }
        };
        let pool = connect(options, args).await?;
        MIGRATOR
            .run(&pool)
            .await
            .context("cannot apply the database migrations")?;
        let pool = Pool::new(pool);
        if let Some(pg) = &embedded {
            // Requests fail fast from the moment the server is gone, not after a timeout.
            let pool = pool.clone();
            pg.on_exit(move |why| pool.mark_down(why));
        }
        Ok(Database { pool, embedded })
    }

    /// A small pool of its own on the same server, connected on first use, for work that must
    /// not queue behind the main pool's requests and writes: the replicas' lease renewals,
    /// which run out a window after they were last renewed (SPEC 16).
    pub fn side_pool(&self, max: u32, acquire_timeout: Duration) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(acquire_timeout)
            .test_before_acquire(false)
            .connect_lazy_with((*self.pool.pg().connect_options()).clone())
    }

    /// `envlens_database_up`, and `envlens_postgres_restarts_total` with an embedded server.
    pub fn register_metrics(&self, metrics: &Metrics) {
        let pool = self.pool.clone();
        metrics.register(
            "envlens_database_up",
            "Whether the database is reachable (0 while it is known to be down)",
            MetricKind::Gauge,
            move || u64::from(!pool.is_down()),
        );
        if let Some(pg) = &self.embedded {
            let restarts = pg.restarts();
            metrics.register(
                "envlens_postgres_restarts_total",
                "Times the embedded PostgreSQL was started again after it exited",
                MetricKind::Counter,
                move || restarts.load(std::sync::atomic::Ordering::Relaxed),
            );
        }
    }

    /// Closes the pool, then stops the embedded server if envlens started it.
    pub async fn close(self) {
        self.pool.close().await;
        if let Some(pg) = self.embedded {
            let _ = tokio::task::spawn_blocking(move || pg.stop()).await;
        }
    }
}

/// A pool that fails fast while the server is away (a request waits at most the acquire
/// timeout, then gets 503) and reconnects by itself when it is back.
pub async fn connect(options: PgConnectOptions, args: &DatabaseArgs) -> anyhow::Result<PgPool> {
    let pool_options = PgPoolOptions::new()
        .max_connections(args.database_max_connections)
        .acquire_timeout(args.database_acquire_timeout)
        // A broken connection fails its query, which is answered 503 and closes it; checking
        // every connection before use would cost a round trip per request.
        .test_before_acquire(false);
    let started = Instant::now();
    loop {
        match pool_options.clone().connect_with(options.clone()).await {
            Ok(pool) => return Ok(pool),
            Err(e) if started.elapsed() < Duration::from_secs(60) => {
                tracing::warn!(error = %e, "database not reachable yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e).context("cannot connect to the database for 60s"),
        }
    }
}

/// The name of a unique or foreign key constraint a statement violated, if that is why it failed.
pub fn violated_constraint(e: &sqlx::Error) -> Option<&str> {
    match e {
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("23505" | "23503")) => {
            db.constraint()
        }
        _ => None,
    }
}
