//! Connections lent to GraphQL requests, taken back without a round trip.
//!
//! sqlx's pool checks every connection that comes back to it with a round trip (a `Sync`),
//! and offers no way to skip it. The blueprint query runs three statements, so that check was
//! a quarter of its round trips, and each round trip wakes a PostgreSQL backend, which is
//! where much of the CPU of a query goes. A [`Lease`] goes back to the stack as it is:
//!
//! - sqlx's connection finishes itself whatever an interrupted statement left: its next
//!   statement first sends what was not sent and reads up to the server's `ReadyForQuery`. A
//!   request dropped halfway (its client gone) therefore costs the next borrower the wait for
//!   the rest of that statement, not a wrong answer;
//! - GraphQL only reads, outside transactions: nothing else carries over from one request to
//!   the next;
//! - a connection whose request saw the database unavailable is [discarded](Lease::discard),
//!   so a restarted server costs each old connection one failed request, as with sqlx's pool.
//!
//! A connection older than the pool's maximum lifetime is closed when it comes back, as the
//! pool would close it.
//!
//! The stack has as many connections as the pool may (`--database-max-connections`), apart
//! from it: the rest of envlens (ingest, the proxy's checks) keeps its own.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, PgPool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The stack of idle connections and the permits that bound how many exist.
#[derive(Clone)]
pub struct Leases(Arc<Shared>);

struct Shared {
    options: Arc<PgConnectOptions>,
    /// Each with the time it was opened.
    idle: Mutex<Vec<(PgConnection, Instant)>>,
    permits: Arc<Semaphore>,
    max_lifetime: Option<Duration>,
    /// How long a request waits for a connection, connecting included, as with the pool.
    timeout: Duration,
}

impl Leases {
    /// As many connections as `pool` may have, to the same server, waiting as long for one.
    pub fn new(pool: &PgPool) -> Self {
        let max = pool.options().get_max_connections() as usize;
        Leases(Arc::new(Shared {
            options: pool.connect_options(),
            idle: Mutex::new(Vec::with_capacity(max)),
            permits: Arc::new(Semaphore::new(max)),
            max_lifetime: pool.options().get_max_lifetime(),
            timeout: pool.options().get_acquire_timeout(),
        }))
    }

    /// An idle connection, or a new one while there are fewer than the maximum; waits for one
    /// to come back otherwise. `PoolTimedOut` (answered 503) after the acquire timeout.
    pub async fn acquire(&self) -> Result<Lease, sqlx::Error> {
        let shared = &self.0;
        tokio::time::timeout(shared.timeout, async {
            let permit = shared
                .permits
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let idle = shared.lock().pop();
            let conn = match idle {
                Some(conn) => conn,
                None => (shared.options.connect().await?, Instant::now()),
            };
            Ok(Lease {
                conn: Some(conn),
                keep: true,
                shared: shared.clone(),
                _permit: permit,
            })
        })
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)?
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(PgConnection, Instant)>> {
        // A push or a pop cannot leave the stack half-changed.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One connection, for one request; back to the stack when dropped.
pub struct Lease {
    conn: Option<(PgConnection, Instant)>,
    keep: bool,
    shared: Arc<Shared>,
    /// Dropped after `drop` has put the connection back, so that the request it wakes finds it.
    _permit: OwnedSemaphorePermit,
}

impl Lease {
    /// Closes the connection instead of putting it back: its request found the database
    /// unavailable, and the connection may be broken.
    pub fn discard(mut self) {
        self.keep = false;
    }
}

impl Deref for Lease {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.conn.as_ref().expect("only taken on drop").0
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn.as_mut().expect("only taken on drop").0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // A connection not kept closes its socket as it drops; the server ends its backend.
        let expired =
            |opened: Instant| (self.shared.max_lifetime).is_some_and(|max| opened.elapsed() >= max);
        if let Some(conn) = self.conn.take() {
            if self.keep && !expired(conn.1) {
                self.shared.lock().push(conn);
            }
        }
    }
}
