//! Connections lent to GraphQL requests and to a fresh deployment creation's two statements,
//! taken back without a round trip.
//!
//! sqlx's pool checks every connection that comes back to it with a round trip (a `Sync`, in
//! a task spawned for it), and offers no way to skip it. The blueprint query runs three
//! statements and a fresh creation two, so that check was a quarter and a third of their
//! round trips, and each round trip wakes a PostgreSQL backend, which is where much of the
//! CPU of a request goes. A [`Lease`] goes back to the stack as it is:
//!
//! - sqlx's connection finishes itself whatever an interrupted statement left: its next
//!   statement first sends what was not sent and reads up to the server's `ReadyForQuery`. A
//!   request dropped halfway (its client gone) therefore costs the next borrower the wait for
//!   the rest of that statement, not a wrong answer;
//! - GraphQL only reads, and a fresh creation's statements each commit on their own, outside
//!   transactions: nothing else carries over from one request to the next (a creation's
//!   transaction takes a connection of the pool, whose check rolls back what a dropped
//!   request left open);
//! - a connection whose request saw the database unavailable is [discarded](Lease::discard),
//!   and one opened before the database last went down (`db::pool`) is closed, not lent: a
//!   restarted server does not cost its old connections a failed request each;
//! - while the database is known to be down, a request gets its 503 at once (`db::pool`).
//!
//! A connection older than the pool's maximum lifetime is closed when it comes back, and one
//! idle for longer than the pool's idle timeout (or past its lifetime while idle) is closed by
//! a sweep that runs as often as the pool's own: the server keeps no backend for a burst that
//! has passed.
//!
//! GraphQL's stack has as many connections as the pool may (`--database-max-connections`),
//! apart from it: the rest of envlens (ingest, the proxy's checks) keeps its own. Fresh
//! creations have a stack of their own, larger (`--database-write-connections`): see
//! [`WRITE_CONNECTIONS`].

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::pool::Pool;
use crate::error::is_out_of_slots;

/// A connection on the stack, with the time it was opened.
struct Idle {
    conn: Opened,
    idle_since: Instant,
}

/// A connection, the time it was opened and how many outages there had been then.
struct Opened {
    conn: PgConnection,
    at: Instant,
    outages: u64,
}

/// The stack of idle connections and the permits that bound how many exist.
#[derive(Clone)]
pub struct Leases(Arc<Shared>);

struct Shared {
    /// The pool's health gate, and its connect options.
    gate: Pool,
    options: Arc<PgConnectOptions>,
    /// Last back on top: each entry's `idle_since` is no earlier than those below it.
    idle: Mutex<Vec<Idle>>,
    permits: Arc<Semaphore>,
    /// The most connections at once, less those [given up](Shared::give_up_one) since.
    max: usize,
    /// Permits given up because the server had no connection slot left; one is given back at
    /// each sweep.
    given_up: Mutex<usize>,
    max_lifetime: Option<Duration>,
    idle_timeout: Option<Duration>,
    /// How long a request waits for a connection, connecting included, as with the pool.
    timeout: Duration,
}

/// The default of `--database-write-connections`: how many connections fresh deployment
/// creations may hold at once, apart from the pool and GraphQL's.
///
/// A creation's second statement commits, and the commit waits for the write-ahead log to be
/// flushed to disk with its connection held and its backend idle; PostgreSQL flushes the
/// commits that wait together in one write. So the creations served at once are bounded by
/// the connections and the disk's flush time, not by the cores that bound the pool
/// (2 x cores + 1). Measured on 2 cores (2026-11-28, `fdatasync` 1-3 ms,
/// `benches/deployments_rounds.sh`, 32 connections against pgbench's 32 clients of the same
/// statements): with the pool's 5, envlens made 2.0 commits per WAL flush where pgbench made
/// 6-8, and the ratio was 0.38 at load 12 (0.84 idle); with `synchronous_commit` off it was 0.75
/// at the same load: the rest was the flush. By connections, at load 12-23: 5 → 0.38,
/// 8 → 0.52, 16 → 0.73, 32 → 0.94. Connections are opened only while that many creations
/// run at once and closed after the pool's idle timeout; with an external PostgreSQL they
/// count against its `max_connections`, as the pool's do.
pub const WRITE_CONNECTIONS: u32 = 32;

impl Leases {
    /// As many connections as `pool` may have, to the same server, waiting as long for one,
    /// kept as long. Call it inside the runtime: the idle sweep is a task of its own.
    pub fn new(gate: &Pool) -> Self {
        Leases::with_max(gate, gate.pg().options().get_max_connections())
    }

    /// As [`Leases::new`], with at most `max` connections.
    pub fn with_max(gate: &Pool, max: u32) -> Self {
        let pool = gate.pg();
        let max = max.max(1) as usize;
        let shared = Arc::new(Shared {
            gate: gate.clone(),
            options: pool.connect_options(),
            idle: Mutex::new(Vec::with_capacity(max)),
            permits: Arc::new(Semaphore::new(max)),
            max,
            given_up: Mutex::new(0),
            max_lifetime: pool.options().get_max_lifetime(),
            idle_timeout: pool.options().get_idle_timeout(),
            timeout: pool.options().get_acquire_timeout(),
        });
        // As the pool's maintenance task: every shorter of the two limits.
        let period = match (shared.max_lifetime, shared.idle_timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(period) = period {
            tokio::spawn(sweep(Arc::downgrade(&shared), period));
        }
        Leases(shared)
    }

    /// An idle connection, or a new one while there are fewer than the maximum; waits for one
    /// to come back otherwise. `PoolTimedOut` (answered 503) after the acquire timeout, and an
    /// error at once while the database is known to be down.
    ///
    /// A server with no connection slot left (SQLSTATE 53300: its `max_connections`, or a
    /// role's or database's limit) while this stack holds others is not an outage: the
    /// request waits for one of this stack's connections instead, and the stack keeps one
    /// connection fewer for each such refusal, given back one a sweep (the pool's idle
    /// timeout).
    pub async fn acquire(&self) -> Result<Lease, sqlx::Error> {
        let shared = &self.0;
        let lease = tokio::time::timeout(shared.timeout, async {
            loop {
                let permit = shared
                    .permits
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed");
                let conn = match shared.pop_usable() {
                    Some(conn) => conn,
                    None => {
                        let outages = shared.gate.outages();
                        match shared.options.connect().await {
                            Ok(conn) => Opened {
                                conn,
                                at: Instant::now(),
                                outages,
                            },
                            Err(e) if is_out_of_slots(&e) && shared.others_out() => {
                                shared.give_up_one(permit);
                                continue;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                };
                return Ok(Lease {
                    conn: Some(conn),
                    keep: true,
                    shared: shared.clone(),
                    _permit: permit,
                });
            }
        });
        let lease = async { lease.await.map_err(|_| sqlx::Error::PoolTimedOut)? };
        shared.gate.guard(lease).await
    }
}

impl Shared {
    /// Whether connections of this stack other than the caller's (which holds a permit and
    /// no connection) are lent out.
    fn others_out(&self) -> bool {
        let given_up = *self.given_up.lock().unwrap_or_else(|e| e.into_inner());
        self.max - given_up - self.permits.available_permits() > 1
    }

    /// One connection fewer for this stack, until a sweep gives it back.
    fn give_up_one(&self, permit: OwnedSemaphorePermit) {
        *self.given_up.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        permit.forget();
    }

    /// One permit given up back, if any.
    fn give_one_back(&self) {
        let mut given_up = self.given_up.lock().unwrap_or_else(|e| e.into_inner());
        if *given_up > 0 {
            *given_up -= 1;
            self.permits.add_permits(1);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // A push or a pop cannot leave the stack half-changed.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn expired(&self, idle: &Idle, now: Instant) -> bool {
        let opened = idle.conn.at;
        idle.conn.outages != self.gate.outages()
            || self
                .max_lifetime
                .is_some_and(|max| now.duration_since(opened) >= max)
            || self
                .idle_timeout
                .is_some_and(|max| now.duration_since(idle.idle_since) >= max)
    }

    /// The most recently returned connection still within the limits; the expired ones
    /// popped on the way are closed (dropped: the sweep closes them politely when it gets
    /// there first).
    fn pop_usable(&self) -> Option<Opened> {
        let now = Instant::now();
        let mut stack = self.lock();
        while let Some(idle) = stack.pop() {
            if !self.expired(&idle, now) {
                return Some(idle.conn);
            }
        }
        None
    }

    /// Takes the expired connections off the bottom of the stack, where the longest idle are.
    fn take_expired(&self) -> Vec<PgConnection> {
        let now = Instant::now();
        let mut stack = self.lock();
        let keep_from = stack
            .iter()
            .position(|idle| !self.expired(idle, now))
            .unwrap_or(stack.len());
        stack
            .drain(..keep_from)
            .map(|idle| idle.conn.conn)
            .collect()
    }
}

/// Closes the connections idle past the idle timeout or the lifetime, every `period`, until
/// the leases are gone.
async fn sweep(shared: Weak<Shared>, period: Duration) {
    let mut every = tokio::time::interval(period);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let expired = shared.take_expired();
        shared.give_one_back();
        drop(shared);
        for conn in expired {
            // A polite goodbye (`Terminate`), but not waiting long for a server that is away.
            let _ = tokio::time::timeout(Duration::from_secs(1), conn.close()).await;
        }
    }
}

/// One connection, for one request; back to the stack when dropped.
pub struct Lease {
    conn: Option<Opened>,
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
        &self.conn.as_ref().expect("only taken on drop").conn
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn.as_mut().expect("only taken on drop").conn
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // A connection not kept closes its socket as it drops; the server ends its backend.
        let expired =
            |opened: Instant| (self.shared.max_lifetime).is_some_and(|max| opened.elapsed() >= max);
        if let Some(conn) = self.conn.take() {
            if self.keep && !expired(conn.at) {
                let idle_since = Instant::now();
                self.shared.lock().push(Idle { conn, idle_since });
            }
        }
    }
}
