//! Who writes envlens' own `HealthChanged` and `GroupHealthChanged` events (SPEC 17): while an
//! environment's group is in use (viewed, listed as events, subscribed to; each use
//! [`Recorder::touch`]es it), the recorder rides its feed as the agent's own identity (the
//! group as it is, not as one viewer may see it): the feed's task, after each read of the
//! group, writes the health marks that changed since the last ([`timeline::changes`]). A
//! change is one row, however many view it:
//! views only keep the recorder running, which stops after the watch cache's idle time with no
//! use, so that it never keeps a namespace watched that nobody reads.
//!
//! Several replicas: each one that serves the environment runs its own recorder and observes
//! the same changes. The write is conditional on the last recorded health of each resource
//! ([`events::record_health`]), so the first replica's write records the event and the others'
//! change nothing. A replica that starts (or restarts) sends the whole group once: what changed
//! while nobody watched is recorded then, but not over a mark written since it started (another
//! replica following the group saw more recently than its first sight may).
//!
//! The same recorder keeps the group's own health, message and time of change
//! (`environment_health`, SPEC 18) for the organization view: the health keeper
//! ([`super::health_keeper`]) [`Recorder::keep`]s every environment with a connection within
//! its budget, so that those recorders run without a view; views only mark which groups were
//! viewed last ([`Recorder::viewed`]), the order the budget keeps them in.

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::environments::Notices;
use super::feeds::{Feed, FeedKey, Feeds, Source};
use crate::db::events;
use crate::db::health::{self as kept, Observed};
use crate::db::pool::Pool;
use crate::graphql::resource_group::HealthStatus;
use crate::k8s::discovery::DiscoveryCache;
use crate::resources::group::ResourceGroup;
use crate::resources::timeline;

/// The recorders running, one per environment. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    shared: Arc<Shared>,
    feeds: Arc<Feeds>,
    running: Arc<Mutex<HashMap<i64, Running>>>,
    /// When each environment's group was last viewed (not kept): the budget keeps the most
    /// recently viewed first.
    viewed: Arc<Mutex<HashMap<i64, Instant>>>,
}

/// What every recording writes with.
struct Shared {
    pool: Pool,
    /// This process' `environmentsUpdated` subscriptions, told of a written health at once.
    notices: Arc<Notices>,
    /// Each environment's group size as its recorder last read it.
    sizes: Mutex<HashMap<i64, usize>>,
}

/// A running recorder: its recording, on the feed of its group.
struct Running {
    feed: Arc<Feed>,
    recording: Arc<Recording>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Recorder {
    pub(super) fn new(pool: Pool, feeds: Arc<Feeds>, notices: Arc<Notices>) -> Self {
        Recorder {
            shared: Arc::new(Shared {
                pool,
                notices,
                sizes: Mutex::default(),
            }),
            feeds,
            running: Arc::default(),
            viewed: Arc::default(),
        }
    }

    /// `environment`'s group, read through `key` (as the agent: no impersonation), is in use:
    /// its recorder runs (started, or moved to the new group after another deployment) for at
    /// least the watch cache's idle time from now.
    pub(crate) fn touch(
        &self,
        environment: i64,
        key: FeedKey,
        source: impl FnOnce() -> Arc<Source>,
    ) {
        lock(&self.viewed).insert(environment, Instant::now());
        self.run(environment, key, source, None);
    }

    /// The health keeper keeps `environment`'s group current: its recorder runs with no view.
    pub(crate) fn keep(
        &self,
        environment: i64,
        key: FeedKey,
        source: impl FnOnce() -> Arc<Source>,
    ) {
        self.run(environment, key, source, Some(true));
    }

    /// The health keeper no longer keeps `environment`'s group: its recorder stops now, unless
    /// a view used it within the idle time (it then stops that long after the view).
    pub(crate) fn unpin(&self, environment: i64) {
        let mut running = lock(&self.running);
        let Some(r) = running.get(&environment) else {
            return;
        };
        if !r.recording.pinned.swap(false, Ordering::Relaxed) {
            return;
        }
        let idle = r.feed.idle();
        let viewed = self.viewed(environment);
        if viewed.is_none_or(|at| at.elapsed() >= idle) {
            self.feeds.detach(&r.feed, &r.recording);
            running.remove(&environment);
        } else {
            // Let go by its feed once unused.
            r.feed.wake();
        }
    }

    /// When `environment`'s group was last viewed in this process.
    pub(crate) fn viewed(&self, environment: i64) -> Option<Instant> {
        lock(&self.viewed).get(&environment).copied()
    }

    /// How many resources `environment`'s group had when its recorder last read it.
    pub(crate) fn size(&self, environment: i64) -> Option<usize> {
        lock(&self.shared.sizes).get(&environment).copied()
    }

    /// Environments whose recorder runs now.
    pub(crate) fn recording(&self) -> Vec<i64> {
        let mut running = lock(&self.running);
        running.retain(|_, r| !r.recording.stopped());
        running.keys().copied().collect()
    }

    fn run(
        &self,
        environment: i64,
        key: FeedKey,
        source: impl FnOnce() -> Arc<Source>,
        pin: Option<bool>,
    ) {
        let mut running = lock(&self.running);
        running.retain(|_, r| !r.recording.stopped());
        let mut pinned = false;
        if let Some(r) = running.get(&environment) {
            if *r.feed.key() == key {
                *lock(&r.recording.used) = Instant::now();
                if let Some(pin) = pin {
                    r.recording.pinned.store(pin, Ordering::Relaxed);
                }
                return;
            }
            pinned = r.recording.pinned.load(Ordering::Relaxed);
            self.feeds.detach(&r.feed, &r.recording);
        }
        let recording = Arc::new(Recording {
            environment,
            shared: self.shared.clone(),
            used: Mutex::new(Instant::now()),
            pinned: AtomicBool::new(pin.unwrap_or(pinned)),
            stopped: AtomicBool::new(false),
            marks: Mutex::new(Marks {
                read: false,
                sent: timeline::Sent::new(),
                written: None,
                started: chrono::Utc::now(),
            }),
        });
        let feed = self.feeds.record(key, source, recording.clone());
        running.insert(environment, Running { feed, recording });
    }

    /// Environments recorded now (for tests and metrics).
    pub fn len(&self) -> usize {
        lock(&self.running)
            .values()
            .filter(|r| !r.recording.stopped())
            .count()
    }
}

/// One environment's recorder, which the feed of its group runs in its own task
/// ([`Feeds::record`]): after each read of the group, it writes the health marks that changed
/// and the group's health ([`Recording::record`]). No task, broadcast or copy of the group of
/// its own: a health keeper runs one per environment (SPEC 18).
pub(crate) struct Recording {
    environment: i64,
    shared: Arc<Shared>,
    used: Mutex<Instant>,
    /// Kept by the health keeper: runs with no use.
    pinned: AtomicBool,
    /// Let go by its feed (unused, or the group could not be read): the next use starts
    /// another.
    stopped: AtomicBool,
    marks: Mutex<Marks>,
}

/// What a recording last wrote.
struct Marks {
    /// Whether it has read the group yet: its first read writes everything.
    read: bool,
    sent: timeline::Sent,
    /// A hash of the group's health last written ([`written`]).
    written: Option<u64>,
    /// When it started: the first write's marks are not over a mark written since.
    started: chrono::DateTime<chrono::Utc>,
}

impl Recording {
    /// Whether its feed has let it go.
    pub(super) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Its feed lets it go.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Whether the health keeper keeps it.
    pub(super) fn pinned(&self) -> bool {
        self.pinned.load(Ordering::Relaxed)
    }

    /// Whether it waits for its first read of the group.
    pub(super) fn fresh(&self) -> bool {
        !lock(&self.marks).read
    }

    /// Whether nobody used it for `idle` and the health keeper does not keep it.
    pub(super) fn unused_for(&self, idle: Duration) -> bool {
        !self.pinned.load(Ordering::Relaxed) && lock(&self.used).elapsed() >= idle
    }

    /// Writes what changed in `group` (as the feed read it, through `key`) since the last
    /// write: the health marks, and the group's health. Whether anything changed.
    pub(super) async fn record(
        &self,
        key: &FeedKey,
        discovery: &DiscoveryCache,
        group: &ResourceGroup,
    ) -> bool {
        let (environment, pool) = (self.environment, &self.shared.pool);
        lock(&self.shared.sizes).insert(environment, group.resources.len());
        let observed = observed(key, discovery, group);
        let health = written(&observed);
        let (write, marks, first_sight) = {
            let mut m = lock(&self.marks);
            m.read = true;
            let first_sight = m.sent.is_empty().then_some(m.started);
            let marks = timeline::changes(&mut m.sent, group);
            (m.written != Some(health), marks, first_sight)
        };
        if write {
            match kept::record(pool.pg(), environment, &observed, chrono::Utc::now()).await {
                Ok(wrote) => {
                    if wrote {
                        self.shared.notices.written(environment);
                    }
                    lock(&self.marks).written = Some(health);
                }
                Err(e) => {
                    tracing::warn!(environment, error = %e, "cannot record the group's health; trying with the next change")
                }
            }
        }
        if marks.is_empty() {
            return write;
        }
        let now = chrono::Utc::now();
        if let Err(e) =
            events::record_health(pool.pg(), environment, &marks, now, first_sight).await
        {
            // Sent again with the next read that carries them.
            let mut m = lock(&self.marks);
            for mark in &marks {
                m.sent.remove(timeline::key_hash(&mark.key));
            }
            tracing::warn!(environment, error = %e, "cannot record health changes; trying with the next change");
        }
        true
    }

    /// The group cannot be read at all (the agent's connection is lost before any kind was
    /// listed): what was kept is not its health any more. The recording stops; the next use
    /// starts another.
    pub(super) async fn lost(&self, why: &str) {
        let environment = self.environment;
        let message = format!("The agent's cluster cannot be reached: {why}");
        match kept::lost(
            self.shared.pool.pg(),
            environment,
            &message,
            chrono::Utc::now(),
        )
        .await
        {
            Ok(true) => self.shared.notices.written(environment),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(environment, error = %e, "cannot record a lost group's health")
            }
        }
        self.stop();
    }
}

/// The group's health now, with its kinds ([`kind_names`]).
fn observed(key: &FeedKey, discovery: &DiscoveryCache, group: &ResourceGroup) -> Observed {
    let discovered = discovery.cached();
    let mut kinds: Vec<(&str, &str)> = group
        .resources
        .iter()
        .map(|r| (r.api_version.as_str(), r.kind.as_str()))
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    let kinds = kind_names(kinds.into_iter(), discovered.as_ref().map(|d| &d.kinds[..]));
    let status = HealthStatus::from(group.health.status);
    Observed {
        agent_id: key.agent,
        namespace: key.namespace.clone(),
        status: status.name(),
        severity: group.health.status.severity() as i16,
        message: group.health.message.clone(),
        kinds,
        objects: i32::try_from(group.resources.len()).unwrap_or(i32::MAX),
    }
}

/// What a recording keeps of the health it last wrote: a hash of every field, not a copy (its
/// kinds' names and message, beside 10,000 groups). Two different healths hashing alike (one
/// chance in 2^64) would leave the second unwritten until the next change.
fn written(observed: &Observed) -> u64 {
    let mut h = DefaultHasher::new();
    let Observed {
        agent_id,
        namespace,
        status,
        severity,
        message,
        kinds,
        objects,
    } = observed;
    (
        agent_id, namespace, status, severity, message, kinds, objects,
    )
        .hash(&mut h);
    h.finish()
}

/// The kinds of a group as `group/version/plural/Kind`, which the organization view reviews a
/// viewer's access to. A kind that discovery does not know (or not yet: this replica's
/// discovery may be empty while the group came through another replica) is kept as
/// `unknown <apiVersion> <Kind>`, which no review can allow: the health is then hidden from a
/// viewer judged by reviews rather than shown without asking for that kind.
fn kind_names<'a>(
    kinds: impl Iterator<Item = (&'a str, &'a str)>,
    discovered: Option<&[crate::k8s::discovery::ApiKind]>,
) -> Vec<String> {
    let names: BTreeSet<String> = kinds
        .map(|(api_version, kind)| {
            discovered
                .and_then(|d| {
                    d.iter()
                        .find(|k| k.kind == kind && k.api_version() == api_version)
                })
                .map_or_else(
                    || format!("unknown {api_version} {kind}"),
                    |k| format!("{}/{}/{}/{}", k.group, k.version, k.plural, k.kind),
                )
        })
        .collect();
    names.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::discovery::ApiKind;

    #[test]
    fn a_kind_discovery_does_not_know_is_kept_as_unknown_not_left_out() {
        let group = [("apps/v1", "Deployment"), ("v1", "Pod")];
        let deployments = ApiKind {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            plural: "deployments".into(),
            namespaced: true,
            watchable: true,
        };
        assert_eq!(
            kind_names(group.into_iter(), Some(&[deployments][..])),
            ["apps/v1/deployments/Deployment", "unknown v1 Pod"]
        );
        // No discovery yet: nothing is left out.
        assert_eq!(
            kind_names(group.into_iter(), None),
            ["unknown apps/v1 Deployment", "unknown v1 Pod"]
        );
    }
}
