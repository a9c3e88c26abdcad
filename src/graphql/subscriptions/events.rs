//! `environmentEventsUpdated(environmentId)` (SPEC 17): the environment's timeline, live. The
//! Kubernetes Events come straight from the watch cache's change feed of the namespace (no
//! coalescing window: an Event reaches the subscriber as the cache applies it), kept to those
//! about a resource of the group as the viewer sees it (followed through the group's shared
//! feed); envlens' own events are written to PostgreSQL, whose triggers queue the environment
//! for the notifications every replica listens to ([`super::environments::Notices`]), and are
//! read from there by id.
//!
//! An Event about a resource the group does not hold yet (a Pod's first Event may come before
//! the feed's next message, which waits up to its window) is held until that message, then
//! sent or dropped.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use async_graphql::dataloader::{DataLoader, HashMapCache};
use async_graphql::futures_util::{stream, Stream};
use async_graphql::{Context, ID};
use axum::http::HeaderMap;
use tokio::sync::broadcast::{self, error::RecvError};

use super::environments::Notice;
use super::feeds::{FeedKey, Source, Subscriber};
use super::resource_group::{environment_id, target, Target};
use super::Live;
use crate::db::events;
use crate::error::Error;
use crate::graphql::events::EnvironmentEvent;
use crate::graphql::loaders::Db;
use crate::graphql::resource_group::FORBIDDEN_MESSAGE;
use crate::graphql::types::{Gql, Result};
use crate::k8s::clusters::{Cluster, Clusters};
use crate::k8s::discovery::events_kind;
use crate::k8s::fetch;
use crate::k8s::watch::{Change, KindChange};
use crate::resources::health::Customizations;
use crate::resources::timeline::Entry;

type Loader = Arc<DataLoader<Db, HashMapCache>>;

/// Events held for a resource the group does not hold yet, at most.
const HELD: usize = 1000;
/// envlens' own events read per notification, at most (the rest with the next read).
const READ: i64 = 100;

struct Running {
    db: Loader,
    clusters: Arc<Clusters>,
    health: Arc<Customizations>,
    live: Live,
    environment: i64,
    key: FeedKey,
    cluster: Cluster,
    changes: broadcast::Receiver<Arc<KindChange>>,
    notices: broadcast::Receiver<Notice>,
    feed: Subscriber,
    /// The group's resources as the viewer sees them; `None` until the feed's first message,
    /// or while the viewer's list of the Events is refused.
    uids: Option<HashSet<String>>,
    /// Whether the feed said anything yet.
    known: bool,
    held: VecDeque<Entry>,
    /// The highest id of envlens' own events sent (or there when the subscription started).
    last_id: i64,
    queue: VecDeque<Entry>,
    recheck: tokio::time::Interval,
    done: bool,
}

pub(super) async fn subscribe(
    ctx: &Context<'_>,
    environment: &ID,
) -> Result<impl Stream<Item = Result<EnvironmentEvent>>> {
    let environment = environment_id(environment)?;
    let db: Loader = ctx.data::<Loader>()?.clone();
    let clusters: Arc<Clusters> = ctx.data::<Arc<Clusters>>()?.clone();
    let health: Arc<Customizations> = ctx.data::<Arc<Customizations>>()?.clone();
    let live: Live = ctx.data::<Live>()?.clone();
    // Listening first: nothing written while the rest is read is missed.
    let notices = live.notices.subscribe().await.gql()?;
    let found = target(&db, &clusters, &health, environment).await;
    let last_id = match &found {
        Ok(_) => {
            let mut conn = db.loader().conn().await.gql()?;
            events::last_id(&mut **conn, environment).await.gql()?
        }
        Err(_) => 0,
    };
    db.loader().release().await;
    let Target { key, source } = found?;
    // The namespace's changes before the group is read: no Event falls between.
    let changes = source.cluster.watch.changes(&key.namespace);
    let cluster = source.cluster.clone();
    record(&live, environment, &key, &source);
    let feed = live.feeds.subscribe(key.clone(), || source);
    let every = clusters
        .grants
        .ttl()
        .max(std::time::Duration::from_millis(100));
    let recheck = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let running = Running {
        db,
        clusters,
        health,
        live,
        environment,
        key,
        cluster,
        changes,
        notices,
        feed,
        uids: None,
        known: false,
        held: VecDeque::new(),
        last_id,
        queue: VecDeque::new(),
        recheck,
        done: false,
    };
    Ok(stream::unfold(running, |mut s| async move {
        let item = s.next().await?;
        Some((item, s))
    }))
}

/// Keeps the environment's health recorder running, as the agent's own identity.
fn record(live: &Live, environment: i64, key: &FeedKey, source: &Source) {
    let none = HeaderMap::new();
    let agent_key = FeedKey::new(key.agent, &key.namespace, &key.selector, &none);
    live.recorder.touch(environment, agent_key, || {
        Arc::new(Source {
            cluster: source.cluster.clone(),
            headers: none.clone(),
            options: source.options.clone(),
            health: source.health.clone(),
            through: None,
            recheck: source.recheck,
        })
    });
}

impl Running {
    async fn next(&mut self) -> Option<Result<EnvironmentEvent>> {
        if self.done {
            return None;
        }
        loop {
            if let Some(entry) = self.queue.pop_front() {
                return Some(Ok(entry.into()));
            }
            tokio::select! {
                change = self.changes.recv() => match change {
                    Ok(change) if change.kind == events_kind() => {
                        if let Change::Applied(object) = &change.change {
                            if let Some(entry) = fetch::timeline_entry(&object.text()) {
                                self.offer(entry);
                            }
                        }
                    }
                    Ok(_) => {}
                    // Events the subscriber missed are in `Environment.events`.
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(lost = n, "environmentEventsUpdated: fell behind the watch cache");
                    }
                    // The cache dropped the namespace (it does not while somebody listens).
                    Err(RecvError::Closed) => {
                        self.changes = self.cluster.watch.changes(&self.key.namespace);
                    }
                },
                notice = self.notices.recv() => match notice {
                    Ok(Notice::Environment(id)) if id != self.environment => {}
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        if let Err(e) = self.read_own().await {
                            return Some(Err(e));
                        }
                    }
                    Err(RecvError::Closed) => return None,
                },
                message = self.feed.next() => match message {
                    Some(Ok(update)) => {
                        let d = &update.delta;
                        let refused = d.errors.iter().any(|e| {
                            e.api_version == "v1" && e.kind == "Event" && e.code == Some(403)
                        });
                        let mut uids = if d.complete { HashSet::new() } else { self.uids.take().unwrap_or_default() };
                        for gone in &d.removed {
                            uids.remove(gone);
                        }
                        uids.extend(d.upserted.iter().map(|r| r.uid.clone()));
                        self.uids = (!refused).then_some(uids);
                        self.known = true;
                        for entry in std::mem::take(&mut self.held) {
                            if self.shown(&entry) {
                                self.queue.push_back(entry);
                            }
                        }
                    }
                    Some(Err(message)) => {
                        self.done = true;
                        return Some(Err(Error::BadGateway(message.to_string()).to_graphql()));
                    }
                    None => return None,
                },
                _ = self.recheck.tick() => {
                    if let Some(end) = self.recheck_access().await {
                        return Some(Err(end));
                    }
                }
            }
        }
    }

    fn shown(&self, entry: &Entry) -> bool {
        match (&self.uids, &entry.resource_uid) {
            (Some(uids), Some(uid)) => uids.contains(uid),
            _ => false,
        }
    }

    /// Sends a Kubernetes Event about the group now, or holds it until the feed says whether
    /// its resource is in the group.
    fn offer(&mut self, entry: Entry) {
        if self.shown(&entry) {
            self.queue.push_back(entry);
        } else if (self.uids.is_some() || !self.known) && entry.resource_uid.is_some() {
            if self.held.len() >= HELD {
                self.held.pop_front();
            }
            self.held.push_back(entry);
        }
    }

    /// envlens' own events written since the last read.
    async fn read_own(&mut self) -> Result<()> {
        let rows = {
            let mut conn = self.db.loader().conn().await.gql()?;
            events::since_id(&mut **conn, self.environment, self.last_id, true, READ)
                .await
                .gql()?
        };
        self.db.loader().release().await;
        for (id, entry) in rows {
            self.last_id = self.last_id.max(id);
            self.queue.push_back(entry);
        }
        Ok(())
    }

    /// The viewer's access again: the error that ends the subscription once it is gone.
    async fn recheck_access(&mut self) -> Option<async_graphql::Error> {
        let found = target(&self.db, &self.clusters, &self.health, self.environment).await;
        self.db.loader().release().await;
        match found {
            Ok(Target { key, source }) => {
                record(&self.live, self.environment, &key, &source);
                if key != self.key {
                    // Another deployment, namespace or identity: its group and namespace.
                    self.changes = source.cluster.watch.changes(&key.namespace);
                    self.cluster = source.cluster.clone();
                    self.feed = self.live.feeds.subscribe(key.clone(), || source);
                    self.key = key;
                    self.uids = None;
                    self.known = false;
                }
                None
            }
            Err(e)
                if crate::graphql::events::is_forbidden(&e)
                    || e.extensions.as_ref().and_then(|x| x.get("code"))
                        == Some(&async_graphql::Value::String("NOT_FOUND".into())) =>
            {
                self.done = true;
                Some(Error::Forbidden(FORBIDDEN_MESSAGE.to_owned()).to_graphql())
            }
            Err(e) => {
                tracing::warn!(error = %e.message, "environmentEventsUpdated: cannot check access; trying again later");
                None
            }
        }
    }
}
