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
//! while nobody watched is recorded then.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::feeds::{FeedKey, Feeds, Source};
use crate::db::events;
use crate::db::pool::Pool;
use crate::resources::timeline;

/// The recorders running, one per environment. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    pool: Pool,
    feeds: Arc<Feeds>,
    running: Arc<Mutex<HashMap<i64, Running>>>,
}

struct Running {
    key: FeedKey,
    used: Arc<Mutex<Instant>>,
    task: tokio::task::AbortHandle,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Recorder {
    pub(super) fn new(pool: Pool, feeds: Arc<Feeds>) -> Self {
        Recorder {
            pool,
            feeds,
            running: Arc::default(),
        }
    }

    /// `environment`'s group, read through `key` (as the agent: no impersonation), is in use:
    /// its recorder runs (started, or moved to the new group after another deployment) for at
    /// least the watch cache's idle time from now.
    pub(crate) fn touch(&self, environment: i64, key: FeedKey, source: impl FnOnce() -> Source) {
        let mut running = lock(&self.running);
        running.retain(|_, r| !r.task.is_finished());
        if let Some(r) = running.get(&environment) {
            if r.key == key && !r.task.is_finished() {
                *lock(&r.used) = Instant::now();
                return;
            }
            r.task.abort();
        }
        let source = source();
        let idle = source.cluster.watch.idle();
        let used = Arc::new(Mutex::new(Instant::now()));
        let subscriber = self.feeds.subscribe(key.clone(), || source);
        let task = tokio::spawn(record(
            self.pool.clone(),
            environment,
            subscriber,
            used.clone(),
            idle,
        ));
        running.insert(
            environment,
            Running {
                key,
                used,
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

/// Follows the feed, writing the health marks that changed, until unused for `idle`.
async fn record(
    pool: Pool,
    environment: i64,
    mut feed: super::feeds::Subscriber,
    used: Arc<Mutex<Instant>>,
    idle: Duration,
) {
    let mut sent = HashMap::new();
    let every = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(60));
    loop {
        let message = tokio::select! {
            message = feed.next() => message,
            () = tokio::time::sleep(every) => {
                if lock(&used).elapsed() >= idle {
                    break;
                }
                continue;
            }
        };
        let Some(Ok(update)) = message else {
            // The feed stopped, or cannot read the group: the next use starts again.
            break;
        };
        let marks = timeline::changes(&mut sent, &update.delta);
        if marks.is_empty() {
            continue;
        }
        if let Err(e) =
            events::record_health(pool.pg(), environment, &marks, chrono::Utc::now()).await
        {
            // Sent again with the next message that carries them.
            for mark in &marks {
                sent.remove(&mark.key);
            }
            tracing::warn!(environment, error = %e, "cannot record health changes; trying with the next change");
        }
    }
    tracing::debug!(environment, "health recorder: unused; stopped");
}
