//! The pool behind a health gate: while the database is known to be down, a request that
//! needs it gets its 503 at once, not after the acquire timeout.
//!
//! The database is known to be down when the embedded server's supervisor saw it exit
//! ([`Pool::mark_down`]), or when a probe cannot connect. A probe runs when a connection cannot
//! be had for want of the server, or takes longer than [`SLOW`] to come (sqlx's pool retries a
//! refused connection until the acquire timeout, which is how every request used to wait its
//! 2-3 s). While down, the probe connects again every [`PROBE_EVERY`]; once it can, the
//! connections opened before the outage are dropped (their backends are gone) and the gate
//! opens. An acquire under way when the database goes down is cut short too.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{ConnectOptions, Connection, PgPool, Postgres, Transaction};
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::error::{is_out_of_slots, is_unavailable};

/// An acquire slower than this has the server probed: a pool merely busy answers the probe.
pub const SLOW: Duration = Duration::from_millis(100);
/// How often the probe tries while the database is down.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);
/// A probe that succeeded this recently answers for the next suspicion: a pool busy for a
/// while must not cost the server a connection per slow request.
const PROBE_COOLDOWN: Duration = Duration::from_millis(500);
/// How long a probe waits to connect: a server that does not answer in this time is down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The pool, cheap to clone; every request's connection comes through [`Pool::acquire`] or
/// [`Pool::begin`].
#[derive(Clone)]
pub struct Pool(Arc<Inner>);

struct Inner {
    pool: PgPool,
    /// `true` while the database is known to be down.
    down: watch::Sender<bool>,
    /// When the current outage began, for the log line that ends it.
    down_since: Mutex<Option<Instant>>,
    /// Counts the outages: a connection opened before the last one began is stale.
    outages: AtomicU64,
    probing: AtomicBool,
    last_good_probe: Mutex<Option<Instant>>,
    /// The supervisor of the embedded server marks the pool down from its own thread.
    runtime: Handle,
}

impl From<PgPool> for Pool {
    fn from(pool: PgPool) -> Self {
        Pool::new(pool)
    }
}

impl Pool {
    /// Gates `pool`. Call it inside the runtime: probes run as tasks of it.
    pub fn new(pool: PgPool) -> Self {
        Pool(Arc::new(Inner {
            pool,
            down: watch::Sender::new(false),
            down_since: Mutex::new(None),
            outages: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            last_good_probe: Mutex::new(None),
            runtime: Handle::current(),
        }))
    }

    /// The pool itself, ungated: for start-up and background work that may wait.
    pub fn pg(&self) -> &PgPool {
        &self.0.pool
    }

    pub fn is_down(&self) -> bool {
        *self.0.down.borrow()
    }

    /// How many outages there were: a connection kept outside the pool and opened before the
    /// last one is stale (see `db::lease`).
    pub fn outages(&self) -> u64 {
        self.0.outages.load(Ordering::Acquire)
    }

    /// A connection, or at once an error (answered 503) while the database is known to be down.
    pub async fn acquire(&self) -> Result<PoolConnection<Postgres>, sqlx::Error> {
        self.guard(self.0.pool.acquire()).await
    }

    /// A transaction on a connection of [`Pool::acquire`].
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.guard(self.0.pool.begin()).await
    }

    /// Runs `connect` (whatever gets a connection) unless the database is known to be down,
    /// and cuts it short if it goes down meanwhile. A slow or failed `connect` has the server
    /// probed.
    pub async fn guard<T>(
        &self,
        connect: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, sqlx::Error> {
        let mut down = self.0.down.subscribe();
        if *down.borrow_and_update() {
            return Err(down_error());
        }
        let went_down = async {
            tokio::select! {
                _ = tokio::time::sleep(SLOW) => self.suspect(),
                _ = down.wait_for(|down| *down) => return,
            }
            // The sender lives as long as `self`: `wait_for` ends only when the database is down.
            let _ = down.wait_for(|down| *down).await;
        };
        // `connect` first: when it is ready at once (an idle connection), the timer of
        // `went_down` is never even registered.
        tokio::select! {
            biased;
            result = connect => {
                if let Err(e) = &result {
                    if is_unavailable(e) {
                        self.suspect();
                    }
                }
                result
            }
            _ = went_down => Err(down_error()),
        }
    }

    /// The database is down (its server exited): requests fail fast until a probe connects.
    pub fn mark_down(&self, why: &str) {
        self.set_down(true, why);
        self.suspect();
    }

    /// Closes the pool's connections (at shutdown).
    pub async fn close(&self) {
        self.0.pool.close().await;
    }

    /// Has the server probed, unless a probe runs or recently succeeded.
    fn suspect(&self) {
        let recent = self
            .0
            .last_good_probe
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() < PROBE_COOLDOWN);
        if (recent && !self.is_down()) || self.0.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        self.0.runtime.spawn(async move { this.probe().await });
    }

    /// Connects until the server answers, keeping the gate closed meanwhile.
    async fn probe(self) {
        loop {
            let options = self.0.pool.connect_options();
            let attempt = tokio::time::timeout(PROBE_TIMEOUT, options.connect()).await;
            match attempt {
                Ok(Ok(conn)) => {
                    let _ = tokio::time::timeout(PROBE_TIMEOUT, conn.close()).await;
                    *self
                        .0
                        .last_good_probe
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                    self.set_down(false, "");
                    break;
                }
                // The server answered, with no slot for one more connection: it is up, and
                // the connections open serve; closing them as after a restart would only
                // give their slots away.
                Ok(Err(e)) if is_out_of_slots(&e) => {
                    tracing::warn!(error = %e, "the database has no connection slot left");
                    self.set_down(false, "");
                    break;
                }
                Ok(Err(e)) if is_unavailable(&e) => self.set_down(true, &e.to_string()),
                Err(_) => self.set_down(true, "the server did not answer the probe in 1s"),
                // Refused for another reason (a password, a missing database): not an outage
                // this gate can wait out; requests say what it is.
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "the database refuses connections");
                    self.set_down(false, "");
                    break;
                }
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
        self.0.probing.store(false, Ordering::Release);
        // Marked down again after the last probe connected, before `probing` was cleared.
        if self.is_down() {
            self.suspect();
        }
    }

    fn set_down(&self, down: bool, why: &str) {
        let mut since = self.0.down_since.lock().unwrap_or_else(|e| e.into_inner());
        match (down, since.is_some()) {
            (true, false) => {
                *since = Some(Instant::now());
                self.0.outages.fetch_add(1, Ordering::AcqRel);
                self.0.down.send_replace(true);
                tracing::warn!(
                    reason = why,
                    "the database is down: requests that need it get 503 until it is back"
                );
                self.drop_idle();
            }
            (false, true) => {
                // Before the gate opens, so that no request gets a connection of the old server.
                self.drop_idle();
                let outage = since.take().map(|at| at.elapsed());
                self.0.down.send_replace(false);
                tracing::info!(?outage, "the database is back");
            }
            _ => {}
        }
    }

    /// Drops the pool's idle connections: their server went away.
    fn drop_idle(&self) {
        for _ in 0..self.0.pool.num_idle() {
            match self.0.pool.try_acquire() {
                // Detached, the pool opens a replacement when one is needed.
                Some(conn) => drop(conn.detach()),
                None => break,
            }
        }
    }
}

fn down_error() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "the database is down; waiting for it to come back",
    ))
}
