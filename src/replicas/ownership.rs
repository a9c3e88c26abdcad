//! Who watches each cluster connection (SPEC 16): membership, rendezvous hashing over the live
//! replicas, and a lease per connection that fences the watches.
//!
//! Every fifth of the window, each replica renews the leases it holds, moves its heartbeat on,
//! reads the live set, takes those of the connections it should own ([`rendezvous::owner`])
//! once they are free, and gives up those another live replica should own (its watches stop
//! first, then the lease is released).
//!
//! The fence: a lease taken or renewed by a statement sent at local instant `t` expires in the
//! database at its `now()` + window, and that `now()` is not before `t`. The replica holds the
//! connection only until `t` + 4/5 of the window on its own monotonic clock ([`Fence`]), so
//! it has stopped watching a fifth of the window before any other replica can take the lease,
//! whether or not it can still reach the database. The fifth covers the watches' own stopping
//! and clocks that run at slightly different rates.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use super::rendezvous;
use crate::db::replicas as db;
use crate::error::Result;
use crate::k8s::watch::fence::{Fence, Fences};

/// A connection this replica holds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Held {
    pub connection: String,
    pub generation: u64,
    pub term: u64,
}

/// This replica in the coordination.
#[derive(Clone)]
pub struct Ownership {
    /// This process' id: random, a new one at every start.
    pub id: String,
    pub advertise_url: String,
    pool: PgPool,
    fences: Fences,
    /// A replica silent this long is dead; also each lease's length in the database.
    window: Duration,
    /// The live replicas as last read (every fifth of the window), this one included: whom a
    /// request for a connection held elsewhere goes to ([`Ownership::owner_elsewhere`]).
    live: Arc<Mutex<Vec<db::Member>>>,
}

impl Ownership {
    pub fn new(pool: PgPool, fences: Fences, advertise_url: String, window: Duration) -> Self {
        Ownership {
            id: format!("{:032x}", rand::random::<u128>()),
            advertise_url,
            pool,
            fences,
            window,
            live: Arc::default(),
        }
    }

    /// The live replica other than this one that owns `connection`, when this one does not
    /// hold it: where a view of it is answered ([`super::forward`]). `None` when this replica
    /// holds it, owns it by the hash (it takes the lease at its next step, and answers by
    /// fresh lists meanwhile), or knows no live replica.
    pub fn owner_elsewhere(&self, connection: &str) -> Option<db::Member> {
        if self.fences.fence(connection).generation().is_some() {
            return None;
        }
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let ids: Vec<String> = live.iter().map(|m| m.id.clone()).collect();
        let owner = rendezvous::owner(connection, &ids)?;
        (owner != self.id)
            .then(|| live.iter().find(|m| m.id == owner).cloned())
            .flatten()
    }

    fn tick(&self) -> Duration {
        self.window / 5
    }

    /// How long a lease renewed at `sent` is held here.
    fn held_until(&self, sent: Instant) -> Instant {
        sent + self.window * 4 / 5
    }

    /// The connections held now, each with its lease's generation and this replica's term
    /// of it ([`Fence::term`]: the same term at two instants means held throughout).
    pub fn held(&self) -> Vec<Held> {
        self.fences
            .all()
            .into_iter()
            .filter_map(|(connection, f)| {
                Some(Held {
                    generation: f.generation()?,
                    term: f.term()?,
                    connection,
                })
            })
            .collect()
    }

    /// Joins the live set: its row, and the live set as it is, before the replica serves
    /// anything. Not knowing the others until its first step, a replica just started
    /// answered what another owns as if nobody owned it (a proxied watch watched the cluster
    /// itself, and outlived the owner's death), for as long as that step took under load.
    pub async fn join(&self) -> Result<()> {
        db::heartbeat(&self.pool, &self.id, &self.advertise_url).await?;
        let members = db::live(&self.pool, self.window).await?;
        *self.live.lock().unwrap_or_else(|e| e.into_inner()) = members;
        Ok(())
    }

    /// Coordinates until the process ends: a step every fifth of the window, each bounded by
    /// it (a database that does not answer is a failed step; the fences then run out).
    pub async fn run(self) {
        let mut failing = false;
        loop {
            let started = Instant::now();
            match tokio::time::timeout(self.tick(), self.step()).await {
                Ok(Ok(())) => {
                    if failing {
                        tracing::info!("replicas: coordination through the database is back");
                    }
                    failing = false;
                }
                Ok(Err(e)) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "replicas: cannot coordinate through the database; the leases held run out unless renewed");
                }
                Err(_) if !failing => {
                    failing = true;
                    tracing::warn!("replicas: the database did not answer in time; the leases held run out unless renewed");
                }
                _ => {}
            }
            tokio::time::sleep_until(started + self.tick()).await;
        }
    }

    /// One round: renew, heartbeat, live set, give up, take.
    ///
    /// The renewal goes first, in one statement, and every lease it renewed is granted at
    /// once: what keeps the watches running is never behind anything slower. A round cut
    /// short by its bound (the database slow under the first takes of a thousand
    /// connections) has then still renewed what it holds; the takes are one statement too.
    async fn step(&self) -> Result<()> {
        let fences = self.fences.all();
        let keys: Vec<String> = fences.iter().map(|(k, _)| k.clone()).collect();
        let sent = Instant::now();
        let renewed: HashMap<String, i64> = db::renew(&self.pool, &self.id, &keys, self.window)
            .await?
            .into_iter()
            .collect();
        for (key, fence) in &fences {
            match renewed.get(key) {
                Some(generation) => self.grant(fence, *generation, sent),
                None if fence.generation().is_some() => {
                    tracing::warn!(connection = %key, "replicas: lease lost; its watches stop");
                    fence.release();
                }
                None => {}
            }
        }
        db::heartbeat(&self.pool, &self.id, &self.advertise_url).await?;
        let members = db::live(&self.pool, self.window).await?;
        let live: Vec<String> = members.iter().map(|m| m.id.clone()).collect();
        *self.live.lock().unwrap_or_else(|e| e.into_inner()) = members;
        let mut give_up = Vec::new();
        let mut wanted = Vec::new();
        for (key, fence) in &fences {
            let mine = rendezvous::owner(key, &live) == Some(self.id.as_str());
            match (renewed.contains_key(key), mine) {
                (true, false) => {
                    // Stop watching first; only then may another replica have the lease.
                    fence.release();
                    give_up.push(key.clone());
                }
                (false, true) => wanted.push(key.clone()),
                _ => {}
            }
        }
        if !give_up.is_empty() {
            tracing::info!(connections = ?give_up, "replicas: handing connections over to their new owners");
            db::release(&self.pool, &self.id, Some(give_up.as_slice())).await?;
        }
        if !wanted.is_empty() {
            let by_key: HashMap<&str, &Fence> =
                fences.iter().map(|(k, f)| (k.as_str(), f)).collect();
            let sent = Instant::now();
            for (key, generation) in
                db::take_all(&self.pool, &wanted, &self.id, self.window).await?
            {
                tracing::info!(connection = %key, generation, "replicas: lease taken; this replica watches the connection");
                if let Some(fence) = by_key.get(key.as_str()) {
                    self.grant(fence, generation, sent);
                }
            }
        }
        db::forget_dead(&self.pool, self.window * 360).await?;
        Ok(())
    }

    fn grant(&self, fence: &Fence, generation: i64, sent: Instant) {
        fence.grant(
            u64::try_from(generation).unwrap_or_default(),
            self.held_until(sent),
        );
    }

    /// A stopping replica: its watches stop, its leases and its row go, so that the others
    /// take over at their next step rather than after the window.
    pub async fn leave(&self) {
        for (_, fence) in self.fences.all() {
            fence.release();
        }
        let left = async {
            db::release(&self.pool, &self.id, None).await?;
            db::leave(&self.pool, &self.id).await
        };
        if let Err(e) = tokio::time::timeout(self.tick(), left)
            .await
            .unwrap_or_else(|_| Err(crate::error::Error::Internal(anyhow::anyhow!("timed out"))))
        {
            tracing::warn!(error = %e, "replicas: could not leave; the others take over after the window");
        }
    }
}
