//! Who writes envlens' own `HealthChanged` and `GroupHealthChanged` events (SPEC 17): while an
//! environment's group is in use (viewed, listed as events, subscribed to; each use
//! [`Recorder::touch`]es it), the recorder follows its feed as the agent's own identity (the
//! group as it is, not as one viewer may see it), and writes the health marks that changed
//! since its last message ([`timeline::changes`]). A change is one row, however many view it:
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::environments::Notices;
use super::feeds::{FeedKey, Feeds, Source};
use crate::db::events;
use crate::db::health::{self as kept, Observed};
use crate::db::pool::Pool;
use crate::graphql::resource_group::HealthStatus;
use crate::k8s::discovery::DiscoveryCache;
use crate::resources::delta::GroupDelta;
use crate::resources::timeline;

/// The recorders running, one per environment. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    pool: Pool,
    feeds: Arc<Feeds>,
    /// This process' `environmentsUpdated` subscriptions, told of a written health at once.
    notices: Arc<Notices>,
    running: Arc<Mutex<HashMap<i64, Running>>>,
    /// When each environment's group was last viewed (not kept): the budget keeps the most
    /// recently viewed first.
    viewed: Arc<Mutex<HashMap<i64, Instant>>>,
    /// Each environment's group size as its recorder last read it.
    sizes: Arc<Mutex<HashMap<i64, usize>>>,
}

struct Running {
    key: FeedKey,
    used: Arc<Mutex<Instant>>,
    /// Kept by the health keeper: runs with no use.
    pinned: Arc<AtomicBool>,
    idle: Duration,
    task: tokio::task::AbortHandle,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Recorder {
    pub(super) fn new(pool: Pool, feeds: Arc<Feeds>, notices: Arc<Notices>) -> Self {
        Recorder {
            pool,
            feeds,
            notices,
            running: Arc::default(),
            viewed: Arc::default(),
            sizes: Arc::default(),
        }
    }

    /// `environment`'s group, read through `key` (as the agent: no impersonation), is in use:
    /// its recorder runs (started, or moved to the new group after another deployment) for at
    /// least the watch cache's idle time from now.
    pub(crate) fn touch(&self, environment: i64, key: FeedKey, source: impl FnOnce() -> Source) {
        lock(&self.viewed).insert(environment, Instant::now());
        self.run(environment, key, source, None);
    }

    /// The health keeper keeps `environment`'s group current: its recorder runs with no view.
    pub(crate) fn keep(&self, environment: i64, key: FeedKey, source: impl FnOnce() -> Source) {
        self.run(environment, key, source, Some(true));
    }

    /// The health keeper no longer keeps `environment`'s group: its recorder stops now, unless
    /// a view used it within the idle time (it then stops that long after the view).
    pub(crate) fn unpin(&self, environment: i64) {
        let mut running = lock(&self.running);
        let Some(r) = running.get(&environment) else {
            return;
        };
        if !r.pinned.swap(false, Ordering::Relaxed) {
            return;
        }
        let viewed = self.viewed(environment);
        if viewed.is_none_or(|at| at.elapsed() >= r.idle) {
            r.task.abort();
            running.remove(&environment);
        }
    }

    /// When `environment`'s group was last viewed in this process.
    pub(crate) fn viewed(&self, environment: i64) -> Option<Instant> {
        lock(&self.viewed).get(&environment).copied()
    }

    /// How many resources `environment`'s group had when its recorder last read it.
    pub(crate) fn size(&self, environment: i64) -> Option<usize> {
        lock(&self.sizes).get(&environment).copied()
    }

    /// Environments whose recorder runs now.
    pub(crate) fn recording(&self) -> Vec<i64> {
        let mut running = lock(&self.running);
        running.retain(|_, r| !r.task.is_finished());
        running.keys().copied().collect()
    }

    fn run(
        &self,
        environment: i64,
        key: FeedKey,
        source: impl FnOnce() -> Source,
        pin: Option<bool>,
    ) {
        let mut running = lock(&self.running);
        running.retain(|_, r| !r.task.is_finished());
        let mut pinned = false;
        if let Some(r) = running.get(&environment) {
            if r.key == key && !r.task.is_finished() {
                *lock(&r.used) = Instant::now();
                if let Some(pin) = pin {
                    r.pinned.store(pin, Ordering::Relaxed);
                }
                return;
            }
            pinned = r.pinned.load(Ordering::Relaxed);
            r.task.abort();
        }
        let pinned = Arc::new(AtomicBool::new(pin.unwrap_or(pinned)));
        let source = source();
        let idle = source.cluster.watch.idle();
        let discovery = source.cluster.discovery.clone();
        let used = Arc::new(Mutex::new(Instant::now()));
        let subscriber = self.feeds.subscribe(key.clone(), || source);
        let task = tokio::spawn(record(
            Task {
                pool: self.pool.clone(),
                notices: self.notices.clone(),
                environment,
                agent: key.agent,
                namespace: key.namespace.clone(),
                discovery,
                sizes: self.sizes.clone(),
                used: used.clone(),
                pinned: pinned.clone(),
                idle,
            },
            subscriber,
        ));
        running.insert(
            environment,
            Running {
                key,
                used,
                pinned,
                idle,
                task: task.abort_handle(),
            },
        );
    }

    /// Environments recorded now (for tests and metrics).
    pub fn len(&self) -> usize {
        lock(&self.running)
            .values()
            .filter(|r| !r.task.is_finished())
            .count()
    }
}

/// What one recorder writes about.
struct Task {
    pool: Pool,
    notices: Arc<Notices>,
    environment: i64,
    agent: i64,
    namespace: String,
    discovery: DiscoveryCache,
    sizes: Arc<Mutex<HashMap<i64, usize>>>,
    used: Arc<Mutex<Instant>>,
    pinned: Arc<AtomicBool>,
    idle: Duration,
}

/// Follows the feed, writing the health marks that changed and the group's health, until
/// unused for `idle` (never while kept).
async fn record(task: Task, mut feed: super::feeds::Subscriber) {
    let Task {
        pool,
        environment,
        used,
        idle,
        ..
    } = &task;
    let environment = *environment;
    let mut sent = timeline::Sent::new();
    let started = chrono::Utc::now();
    let mut group = Group::default();
    let every = (*idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(60));
    loop {
        let message = tokio::select! {
            message = feed.next() => message,
            () = tokio::time::sleep(every) => {
                if !task.pinned.load(Ordering::Relaxed) && lock(used).elapsed() >= *idle {
                    break;
                }
                continue;
            }
        };
        let update = match message {
            Some(Ok(update)) => update,
            Some(Err(why)) => {
                // The group cannot be read at all (the agent's connection is lost before any
                // kind was listed): what was kept is not its health any more.
                let message = format!("The agent's cluster cannot be reached: {why}");
                match kept::lost(pool.pg(), environment, &message, chrono::Utc::now()).await {
                    Ok(true) => task.notices.written(environment),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(environment, error = %e, "cannot record a lost group's health")
                    }
                }
                break;
            }
            // The feed stopped: the next use starts again.
            None => break,
        };
        group.apply(&update.delta);
        lock(&task.sizes).insert(environment, group.kinds.len());
        let observed = group.observed(&task, &update.delta);
        if group.written.as_ref() != Some(&observed) {
            match kept::record(pool.pg(), environment, &observed, chrono::Utc::now()).await {
                Ok(wrote) => {
                    if wrote {
                        task.notices.written(environment);
                    }
                    group.written = Some(observed);
                }
                Err(e) => {
                    tracing::warn!(environment, error = %e, "cannot record the group's health; trying with the next change")
                }
            }
        }
        let first_sight = sent.is_empty().then_some(started);
        let marks = timeline::changes(&mut sent, &update.delta);
        if marks.is_empty() {
            continue;
        }
        let now = chrono::Utc::now();
        if let Err(e) =
            events::record_health(pool.pg(), environment, &marks, now, first_sight).await
        {
            // Sent again with the next message that carries them.
            for mark in &marks {
                sent.remove(&timeline::key_hash(&mark.key));
            }
            tracing::warn!(environment, error = %e, "cannot record health changes; trying with the next change");
        }
    }
    tracing::debug!(environment, "health recorder: unused; stopped");
}

/// The group as its recorder follows it: each resource's kind, and the health last written.
/// Kept small, beside the 10,000 groups a health keeper follows: a hash of each uid and the
/// position of its kind among the group's few.
#[derive(Default)]
struct Group {
    /// uid (hashed) -> position in `names`.
    kinds: HashMap<u64, u32>,
    /// (apiVersion, kind), each once.
    names: Vec<(String, String)>,
    written: Option<Observed>,
}

impl Group {
    fn apply(&mut self, delta: &GroupDelta) {
        if delta.complete {
            self.kinds.clear();
            self.names.clear();
        }
        for uid in &delta.removed {
            self.kinds.remove(&timeline::key_hash(uid));
        }
        for r in &delta.upserted {
            let at = match self
                .names
                .iter()
                .position(|(v, k)| *v == r.api_version && *k == r.kind)
            {
                Some(at) => at,
                None => {
                    self.names.push((r.api_version.clone(), r.kind.clone()));
                    self.names.len() - 1
                }
            };
            self.kinds.insert(timeline::key_hash(&r.uid), at as u32);
        }
    }

    /// The group's health now, with its kinds ([`kind_names`]).
    fn observed(&self, task: &Task, delta: &GroupDelta) -> Observed {
        let discovered = task.discovery.cached();
        let mut used = vec![false; self.names.len()];
        for &at in self.kinds.values() {
            used[at as usize] = true;
        }
        let kinds = kind_names(
            self.names
                .iter()
                .zip(used)
                .filter(|(_, used)| *used)
                .map(|(name, _)| name),
            discovered.as_ref().map(|d| &d.kinds[..]),
        );
        let status = HealthStatus::from(delta.health.status);
        Observed {
            agent_id: task.agent,
            namespace: task.namespace.clone(),
            status: status.name(),
            severity: delta.health.status.severity() as i16,
            message: delta.health.message.clone(),
            kinds,
            objects: i32::try_from(self.kinds.len()).unwrap_or(i32::MAX),
        }
    }
}

/// The kinds of a group as `group/version/plural/Kind`, which the organization view reviews a
/// viewer's access to. A kind that discovery does not know (or not yet: this replica's
/// discovery may be empty while the group came through another replica) is kept as
/// `unknown <apiVersion> <Kind>`, which no review can allow: the health is then hidden from a
/// viewer judged by reviews rather than shown without asking for that kind.
fn kind_names<'a>(
    kinds: impl Iterator<Item = &'a (String, String)>,
    discovered: Option<&[crate::k8s::discovery::ApiKind]>,
) -> Vec<String> {
    let names: BTreeSet<String> = kinds
        .map(|(api_version, kind)| {
            discovered
                .and_then(|d| {
                    d.iter()
                        .find(|k| &k.kind == kind && &k.api_version() == api_version)
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
        let group = [
            ("apps/v1".to_owned(), "Deployment".to_owned()),
            ("v1".to_owned(), "Pod".to_owned()),
        ];
        let deployments = ApiKind {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            plural: "deployments".into(),
            namespaced: true,
            watchable: true,
        };
        assert_eq!(
            kind_names(group.iter(), Some(&[deployments][..])),
            ["apps/v1/deployments/Deployment", "unknown v1 Pod"]
        );
        // No discovery yet: nothing is left out.
        assert_eq!(
            kind_names(group.iter(), None),
            ["unknown apps/v1 Deployment", "unknown v1 Pod"]
        );
    }
}
