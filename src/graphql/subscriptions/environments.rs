//! `environmentsUpdated`: the ops dashboard's feed. Whatever process records a deployment or
//! its status, the database's triggers queue the environment and each process' relay notifies
//! `envlens_environments` within 50 ms (see `db::live::relay`); one
//! listening connection per process ([`Notices`]) hands the ids to the subscriptions, each of
//! which reads the environments it may show and sends them.
//!
//! Nothing is lost while that connection is down: PostgreSQL drops what is notified to nobody,
//! so once the connection listens again every subscription is told to resync
//! ([`Notice::Resync`], also when it fell behind the broadcast): it reads its whole scope again
//! and sends the environments whose version (`db::live::VersionedEnvironment`) differs from the
//! one it last sent or started from.
//!
//! Health: the subscription also follows the resource group feed of each environment it
//! shows (at most [`MAX_WATCHED`], those with a successful deployment through an agent the
//! user has `user_access` to), and sends the environment when its group's health changes.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_graphql::dataloader::{DataLoader, HashMapCache};
use async_graphql::futures_util::{stream, Stream};
use async_graphql::{Context, ID};
use tokio::sync::{broadcast, mpsc, watch};

use super::feeds::Subscriber;
use super::resource_group::{target, Target};
use super::Live;
use crate::db::live::{self, Filter};
use crate::db::pool::Pool;
use crate::db::read::{self, Viewer};
use crate::error::Error;
use crate::graphql::loaders::{self, Db};
use crate::graphql::types::{DeploymentTier, Environment, Gql, Result};
use crate::k8s::clusters::Clusters;
use crate::resources::health::{Customizations, HealthStatus};

/// Notices a subscription may fall behind by; past it, it resyncs.
const BACKLOG: usize = 4096;
/// Environments whose health one subscription follows.
pub const MAX_WATCHED: usize = 200;
/// Environments of a subscription's scope whose versions it keeps, and reads again on a
/// resync (by id: a scope larger than this resyncs its first ones only).
pub const MAX_VERSIONS: usize = 1000;

/// What the listening connection hands to subscriptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// This environment was written.
    Environment(i64),
    /// The connection listens again after it was down: what was notified meanwhile is lost.
    Resync,
}

/// The process's one `LISTEN` connection, open while somebody subscribes.
pub struct Notices {
    pool: Pool,
    tx: broadcast::Sender<Notice>,
    /// Whether the listening task runs (`true` once it listens); its sender drops when it
    /// stops.
    running: Mutex<Option<watch::Receiver<bool>>>,
    /// Set once this process relays the queue of written environments (see [`relay`]).
    relaying: std::sync::atomic::AtomicBool,
}

impl Notices {
    pub fn new(pool: Pool) -> Self {
        Notices {
            pool,
            tx: broadcast::channel(BACKLOG).0,
            running: Mutex::new(None),
            relaying: Default::default(),
        }
    }

    /// Starts this process' relay of written environments to notifications, once. `serve`
    /// starts it at boot (so that the queue never grows while nobody subscribes); a
    /// subscription starts it too, for an app run without `serve`.
    pub fn relay(&self) {
        use std::sync::atomic::Ordering;
        if !self.relaying.swap(true, Ordering::AcqRel) {
            tokio::spawn(relay(self.pool.clone()));
        }
    }

    /// Tells this process' subscriptions at once that `environment` was written (its kept
    /// health, by this process' recorder), ahead of the relay's notification: that one comes
    /// up to [`RELAY_EVERY`] later, for every replica, and finds here nothing new to send
    /// (the version read after this notice is already the written one).
    pub(super) fn written(&self, environment: i64) {
        let _ = self.tx.send(Notice::Environment(environment));
    }

    /// The ids of environments written from now on, by any process on the database. Waits
    /// until the connection listens, so that nothing written after the return is missed.
    pub async fn subscribe(&self) -> std::result::Result<broadcast::Receiver<Notice>, Error> {
        self.relay();
        let rx = self.tx.subscribe();
        let mut ready = {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            match &*running {
                Some(ready) if ready.has_changed().is_ok() => ready.clone(),
                _ => {
                    let (ready_tx, ready) = watch::channel(false);
                    tokio::spawn(listen(self.pool.clone(), self.tx.clone(), ready_tx));
                    *running = Some(ready.clone());
                    ready
                }
            }
        };
        let listening = tokio::time::timeout(Duration::from_secs(10), ready.wait_for(|r| *r)).await;
        match listening {
            Ok(Ok(_)) => Ok(rx),
            _ => Err(Error::Unavailable(sqlx::Error::PoolTimedOut)),
        }
    }
}

/// How often the relay drains the queue: the delay a write may wait before it is notified.
const RELAY_EVERY: Duration = Duration::from_millis(50);

/// Drains the queue of written environments into notifications every [`RELAY_EVERY`], for
/// the life of the process; each replica relays, whichever one wrote.
async fn relay(pool: Pool) {
    let mut tick = tokio::time::interval(RELAY_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        match live::relay(pool.pg()).await {
            Ok(_) => failing = false,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "environment notifications: cannot relay; trying again");
                }
                failing = true;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Listens until nobody subscribes; when the connection drops, listens on a new one and then
/// tells every subscription to resync.
async fn listen(pool: Pool, tx: broadcast::Sender<Notice>, ready: watch::Sender<bool>) {
    let mut dropped = false;
    loop {
        let mut listener = match live::listen(pool.pg()).await {
            Ok(listener) => listener,
            Err(e) => {
                tracing::warn!(error = %e, "environment notifications: cannot listen; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                if tx.receiver_count() == 0 {
                    return;
                }
                continue;
            }
        };
        let _ = ready.send(true);
        if dropped {
            tracing::info!("environment notifications: listening again; subscriptions resync");
            let _ = tx.send(Notice::Resync);
        }
        dropped = true;
        loop {
            tokio::select! {
                notification = listener.try_recv() => match notification {
                    Ok(Some(n)) => {
                        if let Ok(id) = n.payload().parse::<i64>() {
                            let _ = tx.send(Notice::Environment(id));
                        }
                    }
                    // sqlx would reconnect on the next call, but without telling when it
                    // listens again: a new listener instead, then the resync.
                    Ok(None) => {
                        tracing::warn!("environment notifications: the connection dropped; listening again");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "environment notifications: listening failed");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        break;
                    }
                },
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    if tx.receiver_count() == 0 {
                        return;
                    }
                }
            }
        }
    }
}

type Loader = Arc<DataLoader<Db, HashMapCache>>;

struct Running {
    db: Loader,
    viewer: Viewer,
    filter: Filter,
    rx: broadcast::Receiver<Notice>,
    queue: VecDeque<Environment>,
    health: Health,
    /// The version of each environment of the scope as last sent (or as it was when the
    /// subscription started), at most [`MAX_VERSIONS`].
    versions: HashMap<i64, i64>,
}

/// The environments whose group health the subscription follows: a task per environment that
/// sends its id when the health changes. The tasks end with the subscription.
struct Health {
    clusters: Arc<Clusters>,
    custom: Arc<Customizations>,
    live: Live,
    tx: mpsc::UnboundedSender<i64>,
    rx: mpsc::UnboundedReceiver<i64>,
    /// By environment id; `None` for one that has no group the user may see (tried again on
    /// its next notification).
    watched: HashMap<i64, Option<tokio::task::AbortHandle>>,
}

impl Drop for Health {
    fn drop(&mut self) {
        for task in self.watched.values().flatten() {
            task.abort();
        }
    }
}

impl Health {
    /// Follows `environment`'s group unless already done, or the bound reached.
    async fn watch(&mut self, db: &Loader, environment: i64) {
        let known = matches!(self.watched.get(&environment), Some(Some(_)));
        if known || self.watched.len() >= MAX_WATCHED {
            return;
        }
        let found = target(db, &self.clusters, &self.custom, environment).await;
        db.loader().release().await;
        let task = found.ok().map(|Target { key, source }| {
            let subscriber = self.live.feeds.subscribe(key, || source);
            tokio::spawn(health_changes(subscriber, environment, self.tx.clone())).abort_handle()
        });
        self.watched.insert(environment, task);
    }
}

/// Sends `environment` whenever its group's health changes.
async fn health_changes(mut feed: Subscriber, environment: i64, tx: mpsc::UnboundedSender<i64>) {
    let mut last: Option<HealthStatus> = None;
    while let Some(Ok(update)) = feed.next().await {
        let now = update.delta.health.status;
        if last.is_some_and(|l| l != now) && tx.send(environment).is_err() {
            return;
        }
        last = Some(now);
    }
}

pub(super) async fn subscribe(
    ctx: &Context<'_>,
    group_path: Option<ID>,
    project_path: Option<ID>,
    tier: Option<DeploymentTier>,
) -> Result<impl Stream<Item = Result<Environment>>> {
    let db: Loader = ctx.data::<Loader>()?.clone();
    let live: Live = ctx.data::<Live>()?.clone();
    // Listening first: what is written while the rest is read is not missed.
    let rx = live.notices.subscribe().await.gql()?;
    let viewer = db.loader().viewer().await.gql()?;
    // A group the user cannot see matches nothing (and says nothing about whether it exists).
    let group_id = match &group_path {
        Some(path) => {
            let mut conn = db.loader().conn().await.gql()?;
            Some(
                read::visible_group(&mut **conn, viewer, path)
                    .await
                    .gql()?
                    .map_or(-1, |g| g.id),
            )
        }
        None => None,
    };
    let filter = Filter {
        group_id,
        project_path: project_path.map(|p| p.0),
        tier: tier.map(|t| t.as_str().to_owned()),
    };
    let shown = {
        let mut conn = db.loader().conn().await.gql()?;
        live::matching_environments(&mut **conn, viewer, None, &filter, MAX_VERSIONS as i64)
            .await
            .gql()?
    };
    db.loader().release().await;
    let (tx, health_rx) = mpsc::unbounded_channel();
    let mut health = Health {
        clusters: ctx.data::<Arc<Clusters>>()?.clone(),
        custom: ctx.data::<Arc<Customizations>>()?.clone(),
        live,
        tx,
        rx: health_rx,
        watched: HashMap::new(),
    };
    for environment in shown.iter().take(MAX_WATCHED) {
        health.watch(&db, environment.row.id).await;
    }
    let versions = shown.iter().map(|e| (e.row.id, e.version)).collect();
    let running = Running {
        db,
        viewer,
        filter,
        rx,
        queue: VecDeque::new(),
        health,
        versions,
    };
    Ok(stream::unfold(running, |mut s| async move {
        let item = s.next().await?;
        Some((item, s))
    }))
}

/// What a subscription reads after its notices: some environments, or its whole scope.
#[derive(Debug, PartialEq, Eq)]
enum Read {
    Ids(BTreeSet<i64>),
    Resync,
}

impl Read {
    fn add(&mut self, notice: Notice) {
        match (&mut *self, notice) {
            (Read::Ids(ids), Notice::Environment(id)) => {
                ids.insert(id);
            }
            (_, Notice::Resync) => *self = Read::Resync,
            (Read::Resync, Notice::Environment(_)) => {}
        }
    }
}

impl Running {
    async fn next(&mut self) -> Option<Result<Environment>> {
        // The previous message is resolved: its connection goes back, its rows are forgotten.
        self.db.loader().release().await;
        // What is to be read, kept until a read succeeds: a read the database refuses (down,
        // closed to connections) is tried again, so no change is lost to it.
        let mut read = Read::Ids(BTreeSet::new());
        // A change of health is sent even when the rows are as they were.
        let mut health_changed = BTreeSet::new();
        let mut failures = 0;
        loop {
            if let Some(environment) = self.queue.pop_front() {
                return Some(Ok(environment));
            }
            let idle =
                matches!(&read, Read::Ids(ids) if ids.is_empty()) && health_changed.is_empty();
            if idle {
                tokio::select! {
                    notified = self.rx.recv() => match notified {
                        Ok(notice) => read.add(notice),
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(lost = n, "environmentsUpdated: a subscriber fell behind; it resyncs");
                            read.add(Notice::Resync);
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    },
                    Some(id) = self.health.rx.recv() => {
                        health_changed.insert(id);
                    }
                }
            }
            // Those that arrived together are read together.
            loop {
                match self.rx.try_recv() {
                    Ok(notice) => read.add(notice),
                    Err(broadcast::error::TryRecvError::Lagged(_)) => read.add(Notice::Resync),
                    Err(_) => break,
                }
            }
            while let Ok(id) = self.health.rx.try_recv() {
                health_changed.insert(id);
            }
            let ids: Option<Vec<i64>> = match &read {
                Read::Ids(ids) if ids.is_empty() && health_changed.is_empty() => continue,
                Read::Ids(ids) => Some(ids.union(&health_changed).copied().collect()),
                Read::Resync => None,
            };
            loaders::forget(&self.db);
            let limit = ids.as_ref().map_or(MAX_VERSIONS, Vec::len) as i64;
            let rows = {
                let conn = self.db.loader().conn().await;
                match conn {
                    Ok(mut conn) => {
                        live::matching_environments(
                            &mut **conn,
                            self.viewer,
                            ids.as_deref(),
                            &self.filter,
                            limit,
                        )
                        .await
                    }
                    Err(e) => Err(e),
                }
            };
            self.db.loader().release().await;
            let rows = match rows {
                Ok(rows) => rows,
                Err(e) => {
                    failures += 1;
                    tracing::warn!(error = %e, failures, "environmentsUpdated: cannot read what changed; trying again");
                    tokio::time::sleep(retry_after(failures)).await;
                    continue;
                }
            };
            failures = 0;
            read = Read::Ids(BTreeSet::new());
            let health_changed = std::mem::take(&mut health_changed);
            for row in rows {
                let id = row.row.id;
                // What differs from what the subscriber has is sent, after a notice as after a
                // resync: the relay may deliver a write the subscription's first read already
                // saw (`db::live::relay` drains every 50 ms), and a write always moves the
                // version (`xmin`) of a row the version covers.
                let send =
                    self.versions.get(&id) != Some(&row.version) || health_changed.contains(&id);
                if self.versions.contains_key(&id) || self.versions.len() < MAX_VERSIONS {
                    self.versions.insert(id, row.version);
                }
                if send {
                    // A new deployment may have brought a group to follow.
                    self.health.watch(&self.db, id).await;
                    self.queue.push_back(Environment::new(row.row));
                }
            }
        }
    }
}

/// How long to wait before reading again after `failures` reads in a row failed: 100 ms,
/// doubling, at most 5 s.
fn retry_after(failures: u32) -> Duration {
    Duration::from_millis(100 << failures.min(6).saturating_sub(1)).min(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resync_among_notices_reads_the_whole_scope() {
        let mut read = Read::Ids(BTreeSet::new());
        read.add(Notice::Environment(3));
        read.add(Notice::Environment(1));
        read.add(Notice::Environment(3));
        assert_eq!(read, Read::Ids(BTreeSet::from([1, 3])));
        read.add(Notice::Resync);
        read.add(Notice::Environment(4));
        assert_eq!(read, Read::Resync);
    }

    #[test]
    fn a_failed_read_is_tried_again_soon_then_at_most_every_five_seconds() {
        assert_eq!(retry_after(1), Duration::from_millis(100));
        assert_eq!(retry_after(2), Duration::from_millis(200));
        assert!(retry_after(1_000) <= Duration::from_secs(5));
    }
}
