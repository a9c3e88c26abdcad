//! One feed per resource group being watched, shared by every subscriber who sees it the same
//! way (same cluster, namespace, selector and identity towards the cluster): it follows the
//! watch cache's change feed of the namespace, assembles the group again after a change that
//! can reach it ([`Reach`]: not after every change of the namespace), and broadcasts what
//! changed ([`Summary::diff`]). A thousand subscribers of one environment cost
//! one assembly per change, not a thousand.
//!
//! A GitOps environment's feed ([`GitOpsKey`]) follows every namespace its group spans, and
//! the cluster scope of its cluster-scoped entries: what its sources apply, and the Flux
//! objects themselves, wherever they are.
//!
//! Coalescing: a change after a quiet spell is assembled at once; changes within
//! [`WINDOW`] of the last message wait for the window's end and go out as one message. A
//! subscriber that falls behind the broadcast gets the whole group again (`complete`).
//!
//! A message is rendered once per distinct selection, not once per subscriber: it carries its
//! texts ([`Update::rendered`]), which the first subscriber with a selection renders and the
//! others share; the whole group that joining subscribers get first is one shared message
//! too, while the group stays the same.
//!
//! Memory: a feed keeps a [`Summary`] of what it sent, not the group (a health keeper follows
//! 10,000 groups, SPEC 18). Whoever joins, or falls behind, gets the group last sent while
//! another holder keeps it, else waits for the feed's task to assemble it again from the watch
//! cache, from where the next changes follow.
//!
//! A feed may also carry health recorders ([`Recording`], SPEC 17 and 18), which its task runs
//! after each read of the group: a recorder is no subscriber, so a feed that only records (the
//! health keeper's, one per environment) has no broadcast, keeps no summary and runs one task.
//! The broadcast and the summary are there while somebody subscribes.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use async_graphql::futures_util::future::select_all;
use std::time::Duration;

use axum::http::HeaderMap;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::graphql::splice::PerSelection;
use crate::k8s::clusters::Cluster;
use crate::k8s::fetch::{self, FetchOptions};
use crate::k8s::gitops;
use crate::k8s::watch::{Change, KindChange, WatchCache, CLUSTER_SCOPE};
use crate::replicas::forward::AsViewer;
use crate::resources::delta::{GroupDelta, Summary};
use crate::resources::group::ResourceGroup;
use crate::resources::health::Customizations;
use crate::resources::reach::Reach;

use super::health_record::Recording;

/// Changes within this long of the last message are sent together.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Messages a subscriber may fall behind by before it is sent the whole group again: at least
/// [`WINDOW`] apart, 64 are 6.4 s of changes. A broadcast holds all its slots from the start
/// (48 B each, 3 KB a feed): it is opened with a feed's first subscriber, not for its
/// recorders, which follow the feed inside its task and never fall behind.
const BACKLOG: usize = 64;

/// What identifies a feed: whoever shares it sees the same group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FeedKey {
    pub agent: i64,
    pub namespace: String,
    pub selector: String,
    /// The impersonation headers, as sorted `name: value` lines (empty for the agent's own
    /// identity).
    pub identity: String,
    /// The GitOps sources of the group, when it has some (SPEC 15).
    pub gitops: Option<Arc<GitOpsKey>>,
}

/// What a GitOps environment's group is the union of (SPEC 15): its sources, and its labels
/// source (the key's selector) in these namespaces, none when it has none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GitOpsKey {
    pub sources: Vec<crate::gitops::ObjRef>,
    pub labels_namespaces: Vec<String>,
}

impl FeedKey {
    /// The key of a GitOps environment's group, its `namespace` the first it spans.
    pub fn gitops(agent: i64, selector: &str, headers: &HeaderMap, gitops: GitOpsKey) -> Self {
        let first = gitops
            .labels_namespaces
            .first()
            .cloned()
            .or_else(|| gitops.sources.iter().find_map(|s| s.namespace.clone()))
            .unwrap_or_default();
        FeedKey {
            gitops: Some(Arc::new(gitops)),
            ..FeedKey::new(agent, &first, selector, headers)
        }
    }

    pub fn new(agent: i64, namespace: &str, selector: &str, headers: &HeaderMap) -> Self {
        let mut lines: Vec<String> = headers
            .iter()
            .map(|(k, v)| format!("{k}: {}", String::from_utf8_lossy(v.as_bytes())))
            .collect();
        lines.sort();
        FeedKey {
            agent,
            namespace: namespace.to_owned(),
            selector: selector.to_owned(),
            identity: lines.join("\n"),
            gitops: None,
        }
    }
}

/// A message of a feed: a change, or why the group could not be read at all.
pub type Message = Result<Arc<Update>, Arc<str>>;

/// A change as every subscriber of the feed receives it, with its JSON per selection.
pub struct Update {
    pub delta: GroupDelta,
    pub rendered: PerSelection,
}

impl Update {
    fn new(delta: GroupDelta) -> Arc<Self> {
        Arc::new(Update {
            delta,
            rendered: PerSelection::default(),
        })
    }
}

/// The feeds running now.
#[derive(Default)]
pub struct Feeds {
    running: Running,
}

/// By the feed's own key, shared with it: not a copy of its strings (SPEC 18's 10,000 feeds).
type Running = Arc<Mutex<HashMap<Arc<FeedKey>, Arc<Feed>>>>;

/// A running feed.
pub(crate) struct Feed {
    key: Arc<FeedKey>,
    /// How long its cluster's watch cache keeps an unused namespace: how long a recorder
    /// nobody uses runs on.
    idle: Duration,
    state: Mutex<State>,
    /// The first subscriber's way to the owner of the connection (SPEC 16), kept for the
    /// feed's life: a feed started without one (the health keeper's, as the agent) takes it
    /// from the first subscriber who brings one. Boxed: a health keeper's 10,000 feeds have
    /// none (SPEC 18).
    through: OnceLock<Box<AsViewer>>,
    /// Told when a subscriber waits for the whole group ([`State::waiting`]).
    wanted: Notify,
}

/// What a feed keeps between changes. Not the group: a [`Summary`] of what was sent, to tell
/// the next assembly's changes. The whole group, for whoever joins or falls behind, is the
/// group last sent while something else holds it (a view, the watch cache's memo of it), else
/// the feed's task assembles it again for them ([`Subscriber::next`]).
struct State {
    /// Whether the group was read once (and its first message sent, if anybody subscribed).
    read: bool,
    /// What was last sent; `None` until the first assembly, and while nobody subscribes.
    sent: Option<Arc<Summary>>,
    /// The group last sent, while another holder keeps it.
    last: Weak<ResourceGroup>,
    /// The whole group as one message, while a subscriber holds it and nothing was sent
    /// since: those who join meanwhile share it, rendered once per selection.
    complete: Weak<Update>,
    /// Subscribers waiting for the whole group, answered after the task's next assembly.
    waiting: Vec<oneshot::Sender<Result<Whole, Arc<str>>>>,
    /// The subscribers' broadcast, while somebody subscribes.
    tx: Option<broadcast::Sender<Message>>,
    /// The health recorders the task runs after each read.
    recordings: Vec<Arc<Recording>>,
}

/// The whole group for a subscriber who waited for it, and its place in the feed from there.
struct Whole {
    update: Arc<Update>,
    rx: broadcast::Receiver<Message>,
}

impl State {
    fn new(recordings: Vec<Arc<Recording>>) -> Self {
        State {
            read: false,
            sent: None,
            last: Weak::new(),
            complete: Weak::new(),
            waiting: Vec::new(),
            tx: None,
            recordings,
        }
    }

    /// A place among the subscribers, the broadcast opened with the first.
    fn subscribe(&mut self) -> broadcast::Receiver<Message> {
        self.tx
            .get_or_insert_with(|| broadcast::channel(BACKLOG).0)
            .subscribe()
    }

    /// Whether the task needs its timer: to notice that the last subscriber left, to let go
    /// the recorders nobody keeps once unused.
    fn needs_tick(&self) -> bool {
        self.tx.is_some() || self.recordings.iter().any(|r| !r.pinned())
    }

    /// Whether somebody besides the recorders reads what the task reads: a subscriber, or one
    /// waiting for the whole group.
    fn shared(&self) -> bool {
        self.tx.is_some() || !self.waiting.is_empty()
    }

    /// Whether the task should read the group for somebody who has not had it whole: a
    /// subscriber waiting, a recorder not run yet.
    fn wants_whole(&self) -> bool {
        !self.waiting.is_empty() || self.recordings.iter().any(|r| r.fresh())
    }

    /// All of `group` (the group as last sent) as a message.
    fn complete(&mut self, group: &ResourceGroup) -> Arc<Update> {
        if let Some(update) = self.complete.upgrade() {
            return update;
        }
        let update = Update::new(GroupDelta::complete(group));
        self.complete = Arc::downgrade(&update);
        update
    }

    /// A subscriber's start: the whole group now when it is at hand, else a place among those
    /// who wait for the task's next assembly (the task is told).
    fn start(&mut self, feed: &Feed) -> Start {
        if !self.read {
            // The first assembly's message is on its way.
            return Start::Now(None);
        }
        if let Some(group) = self.last.upgrade().filter(|_| self.sent.is_some()) {
            return Start::Now(Some(self.complete(&group)));
        }
        let (tx, rx) = oneshot::channel();
        self.waiting.push(tx);
        feed.wanted.notify_one();
        Start::Waiting(rx)
    }
}

enum Start {
    Now(Option<Arc<Update>>),
    Waiting(oneshot::Receiver<Result<Whole, Arc<str>>>),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a feed reads the group with.
pub struct Source {
    pub cluster: Cluster,
    pub headers: HeaderMap,
    pub options: FetchOptions,
    pub health: Arc<Customizations>,
    /// How often an impersonated group is assembled again with no change: access reviews
    /// (RBAC) may have changed meanwhile.
    pub recheck: Duration,
    /// A subscriber's way to the owner of the connection, when another replica may own it
    /// (SPEC 16): the feed then hears of changes and reads the group through it.
    pub through: Option<crate::replicas::forward::AsViewer>,
}

/// A subscriber's end of a feed.
pub struct Subscriber {
    feed: Arc<Feed>,
    /// The whole group to send first, when the feed had it at hand.
    first: Option<Arc<Update>>,
    /// The whole group to send first, when the feed's task assembles it.
    whole: Option<oneshot::Receiver<Result<Whole, Arc<str>>>>,
    rx: broadcast::Receiver<Message>,
}

impl Subscriber {
    fn starting(feed: Arc<Feed>, start: Start, rx: broadcast::Receiver<Message>) -> Self {
        let (first, whole) = match start {
            Start::Now(first) => (first, None),
            Start::Waiting(whole) => (None, Some(whole)),
        };
        Subscriber {
            feed,
            first,
            whole,
            rx,
        }
    }

    /// The next message: a change, the whole group again after falling behind, or `None` when
    /// the feed stopped. Cancel-safe: a wait for the whole group goes on at the next call.
    pub async fn next(&mut self) -> Option<Message> {
        if let Some(first) = self.first.take() {
            return Some(Ok(first));
        }
        loop {
            if let Some(whole) = self.whole.as_mut() {
                let got = tokio::select! {
                    got = whole => got,
                    message = self.rx.recv() => match message {
                        // What the whole group will hold anyway.
                        Ok(Ok(_)) | Err(RecvError::Lagged(_)) => continue,
                        Ok(Err(message)) => return Some(Err(message)),
                        Err(RecvError::Closed) => return None,
                    },
                };
                self.whole = None;
                return match got.ok()? {
                    Ok(Whole { update, rx }) => {
                        self.rx = rx;
                        Some(Ok(update))
                    }
                    Err(message) => Some(Err(message)),
                };
            }
            match self.rx.recv().await {
                Ok(message) => return Some(message),
                Err(RecvError::Closed) => return None,
                Err(RecvError::Lagged(_)) => {
                    let mut state = lock(&self.feed.state);
                    match state.start(&self.feed) {
                        Start::Now(Some(whole)) => {
                            self.rx = state.subscribe();
                            return Some(Ok(whole));
                        }
                        Start::Now(None) => {}
                        Start::Waiting(whole) => self.whole = Some(whole),
                    }
                }
            }
        }
    }
}

impl Feeds {
    /// Joins the feed of `key`, starting it when none runs.
    pub fn subscribe(&self, key: FeedKey, source: impl FnOnce() -> Source) -> Subscriber {
        let mut running = lock(&self.running);
        if let Some(feed) = running.get(&key) {
            if feed.through().is_none() {
                if let Some(through) = source().through {
                    let _ = feed.through.set(Box::new(through));
                }
            }
            let mut state = lock(&feed.state);
            let rx = state.subscribe();
            let start = state.start(feed);
            drop(state);
            // Its timer, if it had none (a feed that only recorded).
            feed.wanted.notify_one();
            return Subscriber::starting(feed.clone(), start, rx);
        }
        let feed = self.start(&mut running, key, Arc::new(source()), Vec::new());
        let rx = lock(&feed.state).subscribe();
        feed.wanted.notify_one();
        Subscriber::starting(feed, Start::Now(None), rx)
    }

    /// Runs `recording` in the feed of `key` (started when none runs), after each of its reads
    /// of the group, the first one at once; until [`Feeds::detach`]ed, or let go by the feed
    /// ([`Recording::stopped`]). The source may be shared by many feeds (the health keeper's
    /// of one agent share one).
    pub(crate) fn record(
        &self,
        key: FeedKey,
        source: impl FnOnce() -> Arc<Source>,
        recording: Arc<Recording>,
    ) -> Arc<Feed> {
        let mut running = lock(&self.running);
        if let Some(feed) = running.get(&key) {
            lock(&feed.state).recordings.push(recording);
            feed.wanted.notify_one();
            return feed.clone();
        }
        self.start(&mut running, key, source(), vec![recording])
    }

    /// Stops `recording` on `feed`, which ends when nobody else follows it.
    pub(crate) fn detach(&self, feed: &Feed, recording: &Arc<Recording>) {
        recording.stop();
        lock(&feed.state)
            .recordings
            .retain(|r| !Arc::ptr_eq(r, recording));
        feed.wanted.notify_one();
    }

    /// A new feed of `key`, registered, its task started.
    fn start(
        &self,
        running: &mut HashMap<Arc<FeedKey>, Arc<Feed>>,
        key: FeedKey,
        source: Arc<Source>,
        recordings: Vec<Arc<Recording>>,
    ) -> Arc<Feed> {
        let through = OnceLock::new();
        if let Some(given) = &source.through {
            let _ = through.set(Box::new(given.clone()));
        }
        let key = Arc::new(key);
        let feed = Arc::new(Feed {
            idle: source.cluster.watch.idle(),
            key: key.clone(),
            through,
            state: Mutex::new(State::new(recordings)),
            wanted: Notify::new(),
        });
        running.insert(key, feed.clone());
        tokio::spawn(run(self.running.clone(), feed.clone(), source));
        feed
    }

    /// Feeds running now (for tests and metrics).
    pub(super) fn len(&self) -> usize {
        lock(&self.running).len()
    }
}

impl Feed {
    pub(crate) fn key(&self) -> &FeedKey {
        &self.key
    }

    /// How long a recorder nobody uses runs on.
    pub(crate) fn idle(&self) -> Duration {
        self.idle
    }

    /// Wakes the task to look at its recorders again (one was unpinned: its timer may be needed).
    pub(crate) fn wake(&self) {
        self.wanted.notify_one();
    }

    /// The way to the owner of the connection, once a subscriber brought one.
    fn through(&self) -> Option<&AsViewer> {
        self.through.get().map(|through| &**through)
    }
}

/// What woke a feed's task.
enum Wake {
    /// A change that can reach the group (or the owner's word of one).
    Change,
    /// A subscriber or a recorder waits for the whole group, or a recorder left.
    Whole,
    /// Time to read an impersonated group again (access reviews may have changed), or to let
    /// unused recorders go.
    Tick,
}

/// However the task ends, its recorders are let go: the next use starts them again.
struct LetGo<'a>(&'a Feed);

impl Drop for LetGo<'_> {
    fn drop(&mut self) {
        for r in std::mem::take(&mut lock(&self.0.state).recordings) {
            r.stop();
        }
    }
}

/// The feed's task: reads the group, then follows the namespaces' changes until nobody
/// subscribes or records any more.
/// The source is shared (the health keeper's feeds of one agent share one, SPEC 18): inline,
/// it was ~470 B of each task.
async fn run(running: Running, feed: Arc<Feed>, source: Arc<Source>) {
    let _let_go = LetGo(&feed);
    let key = &feed.key;
    let watch = &source.cluster.watch;
    let mut changes = Changes::default();
    changes.follow(watch, &initial_namespaces(key));
    // The reads and the owner's changes are boxed: awaited inline, their futures (a group's
    // assembly, an HTTP request to the owner) would size the task's future, which a health
    // keeper holds 10,000 of while they idle (SPEC 18; ~10 KB each inline, BENCHMARKS.md).
    let mut heard = Box::pin(super::routed::listen(&source, key, feed.through())).await;
    match Box::pin(read(&source, key, &feed, &mut changes)).await {
        Ok(group) => {
            publish(&feed, &group, None);
            record(&feed, &source, &group).await;
        }
        Err(message) => {
            leave(&running, key, &feed);
            let message: Arc<str> = message.into();
            refuse_waiting(&feed, &message);
            let (tx, recordings) = {
                let mut state = lock(&feed.state);
                (state.tx.clone(), std::mem::take(&mut state.recordings))
            };
            if let Some(tx) = tx {
                let _ = tx.send(Err(message.clone()));
            }
            for r in recordings {
                Box::pin(r.lost(&message)).await;
            }
            return;
        }
    };
    let mut last_sent = Instant::now();
    let impersonated = !source.headers.is_empty();
    // An impersonated group is read again every `recheck`; a recorder nobody uses goes
    // within a quarter of the idle time after its last use.
    let every = if impersonated {
        source.recheck
    } else {
        (feed.idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(60))
    };
    // A timer only while something needs one (its `Sleep` is ~110 B, beside 10,000 feeds that
    // only record, SPEC 18): whoever makes it needed (a subscriber, a recorder left unpinned)
    // wakes the task, which starts it here.
    let mut tick: Option<tokio::time::Interval> = None;
    loop {
        if !(impersonated || lock(&feed.state).needs_tick()) {
            tick = None;
        } else if tick.is_none() {
            let mut every = tokio::time::interval_at(Instant::now() + every, every);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick = Some(every);
        }
        let ticked = async {
            match &mut tick {
                Some(tick) => {
                    tick.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        // Boxed while there is an owner to hear from: its wait (a timer, the owner's stream)
        // would otherwise size every task's future, a health keeper's 10,000 of which never
        // have one.
        let owners = async {
            if heard.quiet(key, feed.through()) {
                std::future::pending().await
            } else {
                Box::pin(heard.next(&source, key, feed.through())).await
            }
        };
        let wake = tokio::select! {
            heard_of = owners => {
                if !heard_of {
                    // Ended, or the connection changed hands: heard from its owner now.
                    tokio::time::sleep(WINDOW).await;
                    heard = Box::pin(super::routed::listen(&source, key, feed.through())).await;
                }
                Wake::Change
            }
            () = changes.next(watch) => Wake::Change,
            () = feed.wanted.notified() => Wake::Whole,
            () = ticked => Wake::Tick,
        };
        if matches!(wake, Wake::Tick) {
            let_go_unused(&feed);
        }
        if unsubscribed(&running, key, &feed) {
            break;
        }
        match wake {
            Wake::Tick if !impersonated => continue,
            // Answered meanwhile, by an assembly after a change.
            Wake::Whole if !lock(&feed.state).wants_whole() => continue,
            Wake::Whole => {}
            Wake::Change | Wake::Tick => {
                let due = last_sent + WINDOW;
                if Instant::now() < due {
                    tokio::time::sleep_until(due).await;
                }
                // Whatever arrived meanwhile is in the assembly below.
                changes.drain();
                if matches!(wake, Wake::Change) {
                    watch.metrics().feed_assemblies.inc();
                }
            }
        }
        match Box::pin(read(&source, key, &feed, &mut changes)).await {
            Ok(next) => {
                let sent = lock(&feed.state).sent.clone();
                let delta = sent.map(|sent| (sent.diff(&next), sent));
                if let Some((delta, sent)) = delta {
                    if sent.changed(&delta) {
                        publish(&feed, &next, Some(delta));
                        last_sent = Instant::now();
                    }
                }
                answer_waiting(&feed, &next);
                if record(&feed, &source, &next).await {
                    // What recorders write is coalesced as messages are.
                    last_sent = Instant::now();
                }
            }
            Err(message) => {
                tracing::warn!(namespace = %key.namespace, error = %message, "resource group feed: cannot read the group; keeping the last one");
                refuse_waiting(&feed, &message.into());
            }
        }
    }
    lock(&feed.state).waiting.clear();
    tracing::debug!(namespace = %key.namespace, "resource group feed: no subscriber left");
}

/// Runs the feed's recorders on `group`, as just read; whether any wrote.
async fn record(feed: &Feed, source: &Source, group: &ResourceGroup) -> bool {
    let recordings = lock(&feed.state).recordings.clone();
    let mut wrote = false;
    for r in recordings {
        // Boxed: a write's future would otherwise size the task's, idle most of the time.
        wrote |= Box::pin(r.record(&feed.key, &source.cluster.discovery, group)).await;
    }
    wrote
}

/// Lets go the recorders nobody used for the idle time and the health keeper does not keep.
fn let_go_unused(feed: &Feed) {
    lock(&feed.state).recordings.retain(|r| {
        let unused = r.unused_for(feed.idle);
        if unused {
            r.stop();
        }
        !unused
    });
}

/// Hands the subscribers waiting for the whole group `group`, the group as last sent (or, when
/// nothing was sent since they subscribed, the one they start from), and their place in the
/// feed from here.
fn answer_waiting(feed: &Feed, group: &Arc<ResourceGroup>) {
    let mut state = lock(&feed.state);
    if state.waiting.is_empty() {
        return;
    }
    if state.sent.is_none() {
        // Subscribed to a feed that only recorded: what they are sent from here on is told
        // from this group.
        state.sent = Some(Arc::new(Summary::of(group, None)));
        state.last = Arc::downgrade(group);
        state.complete = Weak::new();
    }
    let update = state.complete(group);
    for waiting in std::mem::take(&mut state.waiting) {
        let rx = state.subscribe();
        let _ = waiting.send(Ok(Whole {
            update: update.clone(),
            rx,
        }));
    }
}

/// Tells the subscribers waiting for the whole group that it cannot be read: as a new feed's
/// first subscriber is told.
fn refuse_waiting(feed: &Feed, message: &Arc<str>) {
    for waiting in std::mem::take(&mut lock(&feed.state).waiting) {
        let _ = waiting.send(Err(message.clone()));
    }
}

/// The namespaces a feed follows before its first read: the key's, and for a GitOps group
/// those its labels source and its sources name, and the cluster scope.
fn initial_namespaces(key: &FeedKey) -> Vec<String> {
    let mut namespaces = vec![key.namespace.clone()];
    if let Some(gitops) = &key.gitops {
        namespaces.extend(gitops.labels_namespaces.iter().cloned());
        namespaces.extend(gitops.sources.iter().filter_map(|s| s.namespace.clone()));
        namespaces.push(CLUSTER_SCOPE.to_owned());
    }
    namespaces
}

/// Reads the group, then follows the namespaces it spans: subscribed before the read that
/// shows them, so no change falls between. A group that spans namespaces not followed before
/// (a source applies in a new one) is read again once they are (a few times at most, for
/// sources nested deeper).
async fn read(
    source: &Source,
    key: &FeedKey,
    feed: &Feed,
    changes: &mut Changes,
) -> Result<Arc<ResourceGroup>, String> {
    let mut rounds = 0;
    loop {
        // A group somebody subscribes to (or waits for) is kept by the cache for the views
        // and the subscribers who join next; one that is only recorded is not.
        let shared = lock(&feed.state).shared();
        let (group, spans) = assemble(source, key, feed.through(), shared).await?;
        changes.read(key, &group);
        rounds += 1;
        if !changes.follow(&source.cluster.watch, &spans) || rounds > 3 {
            return Ok(group);
        }
    }
}

/// The change feeds of the namespaces a feed follows, as one, passing on only the changes that
/// can reach the group ([`Reach`]).
/// The namespaces in a vector, not a map: a group spans one or a few (a health keeper holds
/// 10,000 of these, SPEC 18).
#[derive(Default)]
struct Changes {
    feeds: Vec<(String, broadcast::Receiver<Arc<KindChange>>)>,
    /// What the group last read can be reached by; `None` before a read, and for a GitOps
    /// group (its sources' inventories decide its members): every change then.
    reach: Option<Reach>,
}

impl Changes {
    /// Follows exactly `namespaces` from now on; whether some were not followed before.
    fn follow(&mut self, watch: &WatchCache, namespaces: &[String]) -> bool {
        self.feeds.retain(|(ns, _)| namespaces.contains(ns));
        let mut added = false;
        for ns in namespaces {
            if !self.feeds.iter().any(|(followed, _)| followed == ns) {
                self.feeds.push((ns.clone(), watch.changes(ns)));
                added = true;
            }
        }
        self.feeds.shrink_to_fit();
        added
    }

    /// Waits for a change in any of the namespaces that can reach the group (or a lag, which
    /// calls for a read all the same). A namespace whose feed closed (the cache dropped it) is
    /// followed anew.
    async fn next(&mut self, watch: &WatchCache) {
        let reach = self.reach.as_ref();
        let closed = match &mut self.feeds[..] {
            [] => return std::future::pending().await,
            // One namespace (every labels group): its wait inline, no vectors of boxes.
            [(_, rx)] => next_reaching(rx, reach).await.then_some(0),
            feeds => {
                type Next<'a> =
                    Pin<Box<dyn std::future::Future<Output = Option<usize>> + Send + 'a>>;
                let waits: Vec<Next<'_>> = feeds
                    .iter_mut()
                    .enumerate()
                    .map(|(i, (_, rx))| -> Next<'_> {
                        Box::pin(async move { next_reaching(rx, reach).await.then_some(i) })
                    })
                    .collect();
                select_all(waits).await.0
            }
        };
        if let Some(i) = closed {
            let (ns, rx) = &mut self.feeds[i];
            *rx = watch.changes(ns);
        }
    }

    /// The group read now: the changes from here on are tested against it.
    fn read(&mut self, key: &FeedKey, group: &ResourceGroup) {
        self.reach = key
            .gitops
            .is_none()
            .then(|| Reach::of(group, fetch::equality_terms(&key.selector)));
    }

    /// Forgets what arrived so far.
    fn drain(&mut self) {
        for (_, rx) in &mut self.feeds {
            while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = rx.try_recv() {}
        }
    }
}

/// Waits for a change that can reach the group of `reach` (or a lag); whether the feed closed
/// instead.
async fn next_reaching(
    rx: &mut broadcast::Receiver<Arc<KindChange>>,
    reach: Option<&Reach>,
) -> bool {
    loop {
        match rx.recv().await {
            Err(RecvError::Closed) => return true,
            Ok(change) if !reaches(reach, &change) => continue,
            _ => return false,
        }
    }
}

/// Whether `change` can move the group of `reach` (every change can without one). A kind listed
/// again, or whose watch starts or stops failing, moves what the group shows of it.
fn reaches(reach: Option<&Reach>, change: &KindChange) -> bool {
    match (&change.change, reach) {
        (Change::Applied(object) | Change::Deleted(object), Some(reach)) => reach.reaches(object),
        _ => true,
    }
}

/// Sends the change from what was sent to `group` (the whole group when `delta` is `None`) and
/// keeps `group`'s summary, under one lock: a subscriber joining takes either the state before
/// and this change, or the state after.
fn publish(feed: &Feed, group: &Arc<ResourceGroup>, delta: Option<GroupDelta>) {
    let mut state = lock(&feed.state);
    state.read = true;
    let Some(tx) = state.tx.clone() else {
        // Nobody subscribes: nothing to send, or to tell the next changes from.
        return;
    };
    let summary = Summary::of(group, state.sent.as_deref());
    state.sent = Some(Arc::new(summary));
    state.last = Arc::downgrade(group);
    // The whole of the group before is nobody's first message any more.
    state.complete = Weak::new();
    let update = match delta {
        Some(delta) => Update::new(delta),
        None => state.complete(group),
    };
    let _ = tx.send(Ok(update));
}

/// Whether nobody subscribes or records any more; the feed then leaves the registry, under its
/// lock so that nobody joins it meanwhile. With recorders only, what was kept for subscribers
/// (the broadcast, the summary) goes.
fn unsubscribed(running: &Running, key: &FeedKey, feed: &Arc<Feed>) -> bool {
    let mut running = lock(running);
    let mut state = lock(&feed.state);
    if state.tx.as_ref().is_some_and(|tx| tx.receiver_count() > 0) {
        return false;
    }
    state.tx = None;
    state.sent = None;
    state.last = Weak::new();
    state.complete = Weak::new();
    if !state.recordings.is_empty() {
        return false;
    }
    drop(state);
    if running.get(key).is_some_and(|f| Arc::ptr_eq(f, feed)) {
        running.remove(key);
    }
    true
}

fn leave(running: &Running, key: &FeedKey, feed: &Arc<Feed>) {
    let mut running = lock(running);
    if running.get(key).is_some_and(|f| Arc::ptr_eq(f, feed)) {
        running.remove(key);
    }
}

/// The group from the watch cache (assembled off the runtime's threads, shared with the
/// views of the same group at the same generation), and the namespaces it spans (through the
/// owner when another replica owns a labels group's connection); while the
/// agent's circuit is open, as a view shows it then ([`ResourceGroup::while_away`]). The
/// circuit opens and closes as the watches fail and resume, which are changes the feed reads
/// the group again for.
async fn assemble(
    source: &Source,
    key: &FeedKey,
    through: Option<&AsViewer>,
    keep: bool,
) -> Result<(Arc<ResourceGroup>, Vec<String>), String> {
    if let Some(owners) = super::routed::through_owner(source, key, through).await {
        return owners.map(|group| (group, vec![key.namespace.clone()]));
    }
    let cluster = &source.cluster;
    let (group, spans) = match &key.gitops {
        None => {
            let group = cluster
                .watch
                .resource_group_kept(
                    &cluster.discovery,
                    &source.headers,
                    &key.namespace,
                    &key.selector,
                    &source.options,
                    &source.health,
                    keep,
                )
                .await
                .map_err(|e| e.to_string())?;
            (group, vec![key.namespace.clone()])
        }
        Some(gitops) => {
            let reader = gitops::Reader {
                watch: &cluster.watch,
                memo: &cluster.gitops,
                client: &cluster.client,
                discovery: &cluster.discovery,
                headers: &source.headers,
                options: &source.options,
            };
            let labels = (!gitops.labels_namespaces.is_empty()).then(|| gitops::LabelsSource {
                namespaces: gitops.labels_namespaces.clone(),
                selector: key.selector.clone(),
            });
            // No hint of the namespaces spanned before: a feed is keyed by its sources, not
            // by an environment to keep one by; its first read learns them as it always has.
            let grouped = gitops::resource_group(
                &reader,
                &gitops.sources,
                labels.as_ref(),
                &[],
                &source.health,
            )
            .await
            .map_err(|e| e.to_string())?;
            let mut spans = grouped.namespaces;
            spans.push(CLUSTER_SCOPE.to_owned());
            (grouped.group, spans)
        }
    };
    let group = match cluster.condition.circuit().open() {
        Some(open) => Arc::new(group.while_away(open.since, &open.said())),
        None => group,
    };
    Ok((group, spans))
}
