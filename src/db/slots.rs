//! Per-person bounds shared by every replica (SPEC 13, "Bounded per person"): what a user holds
//! open (watch-API sockets, GraphQL subscriptions) is a row each in `user_slots`, counted under
//! a lock of that user and kind, so that two replicas admitting the same user at once cannot
//! both take the last place. A row is a lease: its replica renews it every third of
//! [`LEASE`] while the socket or subscription runs and deletes it when it ends; a replica that
//! dies leaves rows that stop counting once their lease runs out.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::PgConnection;
use tokio::sync::Semaphore;

use super::pool::Pool;
use crate::config::file::PerUserLimits;
use crate::error::{Error, Result};

/// How long a slot outlives a replica that stopped renewing it.
pub const LEASE: Duration = Duration::from_secs(60);

/// What a slot holds open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    WatchSocket,
    Subscription,
}

impl SlotKind {
    fn as_str(self) -> &'static str {
        match self {
            SlotKind::WatchSocket => "watch_socket",
            SlotKind::Subscription => "subscription",
        }
    }
}

/// This replica's slots and the bounds they are taken under. Cheap to clone.
#[derive(Clone)]
pub struct Slots(Arc<Inner>);

struct Inner {
    pool: Pool,
    limits: PerUserLimits,
    /// The ids of the rows this replica holds, renewed together.
    held: Mutex<HashSet<i64>>,
    /// Takes running at once.
    takes: Semaphore,
}

/// Takes running at once on one replica.
const TAKES_AT_ONCE: usize = 4;

/// One place taken; given back when dropped.
pub struct Slot {
    id: i64,
    inner: Arc<Inner>,
}

impl Slots {
    /// Call it inside the runtime: the renewal is a task of its own, for as long as the slots
    /// live.
    pub fn new(pool: &Pool, limits: PerUserLimits) -> Self {
        let inner = Arc::new(Inner {
            pool: pool.clone(),
            limits,
            held: Mutex::default(),
            takes: Semaphore::new(TAKES_AT_ONCE),
        });
        tokio::spawn(renew(Arc::downgrade(&inner)));
        Slots(inner)
    }

    pub fn limits(&self) -> PerUserLimits {
        self.0.limits
    }

    /// A place of `kind` for `user_id`; `None` when the user holds as many as the bound
    /// allows, on any replica. An error when the database cannot be asked (nothing is taken).
    ///
    /// Taken by a task of its own: the transaction holds the user's lock, and a caller that
    /// stops being polled halfway (a socket whose task waits on something else) must not keep
    /// it, nor its connection. A caller that goes away has its place given back when the
    /// task ends.
    pub async fn take(&self, user_id: i64, kind: SlotKind) -> Result<Option<Slot>> {
        let inner = self.0.clone();
        let task = tokio::spawn(async move {
            let max = match kind {
                SlotKind::WatchSocket => inner.limits.watch_sockets,
                SlotKind::Subscription => inner.limits.subscriptions,
            };
            // A few at a time: a burst of one user's takes, which wait for each other in the
            // database, does not hold every connection of the pool.
            let turn = inner.takes.acquire().await;
            let mut tx = inner.pool.begin().await?;
            let id = take(&mut tx, user_id, kind.as_str(), max).await?;
            tx.commit().await?;
            drop(turn);
            Ok::<_, Error>(id.map(|id| {
                inner.lock().insert(id);
                Slot { id, inner }
            }))
        });
        task.await
            .map_err(|e| Error::Internal(anyhow::anyhow!("taking a per-user slot: {e}")))?
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<i64>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.inner.lock().remove(&self.id);
        // Deleted in the background; without a runtime (the process is ending), or if the
        // database is away, the row goes when its lease runs out.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (pool, id) = (self.inner.pool.clone(), self.id);
            runtime.spawn(async move {
                if let Ok(mut conn) = pool.acquire().await {
                    let _ = release(&mut conn, id).await;
                }
            });
        }
    }
}

/// Renews the held rows, and forgets the expired ones of every replica, every third of the
/// lease, until the slots are gone.
async fn renew(inner: Weak<Inner>) {
    let mut every = tokio::time::interval(LEASE / 3);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let held: Vec<i64> = inner.lock().iter().copied().collect();
        let pool = inner.pool.clone();
        drop(inner);
        let renewed = async {
            let mut conn = pool.acquire().await?;
            if !held.is_empty() {
                extend(&mut conn, &held).await?;
            }
            forget_expired(&mut conn).await
        };
        if let Err(e) = renewed.await {
            tracing::warn!(error = %e, "the per-user slots could not be renewed");
        }
    }
}

fn lease_seconds() -> f64 {
    LEASE.as_secs_f64()
}

/// Takes a place when `user_id` holds fewer than `max` live ones of `kind`; its id.
async fn take(
    conn: &mut PgConnection,
    user_id: i64,
    kind: &str,
    max: usize,
) -> Result<Option<i64>> {
    // One lock per user and kind, held to the end of the transaction.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("envlens.user_slots:{kind}:{user_id}"))
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM user_slots WHERE user_id = $1 AND kind = $2 AND expires_at <= now()")
        .bind(user_id)
        .bind(kind)
        .execute(&mut *conn)
        .await?;
    let id = sqlx::query_scalar(
        "INSERT INTO user_slots (user_id, kind, expires_at)
         SELECT $1, $2, now() + make_interval(secs => $3)
         WHERE (SELECT count(*) FROM user_slots WHERE user_id = $1 AND kind = $2) < $4
         RETURNING id",
    )
    .bind(user_id)
    .bind(kind)
    .bind(lease_seconds())
    .bind(i64::try_from(max).unwrap_or(i64::MAX))
    .fetch_optional(&mut *conn)
    .await?;
    Ok(id)
}

async fn extend(conn: &mut PgConnection, ids: &[i64]) -> Result<()> {
    sqlx::query(
        "UPDATE user_slots SET expires_at = now() + make_interval(secs => $2) WHERE id = ANY($1)",
    )
    .bind(ids)
    .bind(lease_seconds())
    .execute(conn)
    .await?;
    Ok(())
}

async fn release(conn: &mut PgConnection, id: i64) -> Result<()> {
    sqlx::query("DELETE FROM user_slots WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

async fn forget_expired(conn: &mut PgConnection) -> Result<()> {
    sqlx::query("DELETE FROM user_slots WHERE expires_at <= now()")
        .execute(conn)
        .await?;
    Ok(())
}
