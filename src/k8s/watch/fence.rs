//! Whether this replica may watch a cluster connection now (SPEC 16).
//!
//! Of the replicas on one database, one at a time holds a connection's lease
//! ([`crate::replicas`]); its watch cache watches, the others' do not. A [`Fence`] is this
//! replica's side of the lease: the generation it holds and until when, on this process' own
//! clock. It expires by itself: a replica cut from the database, whose renewals fail, stops
//! its watches at that instant, which comes before the database lets another replica take the
//! lease ([`crate::replicas::ownership`] says why). A single process (tests, `demo`) holds
//! every fence for ever.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

/// What this replica holds of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Not held: the cache runs no watch of the connection.
    Released,
    /// Held under the lease of `generation` until `until` (`None`: for as long as the process
    /// runs); `term` counts this process' unbroken holds, so that whatever was watched under
    /// an earlier one (stopped when it was lost) is never taken for current.
    Held {
        generation: u64,
        term: u64,
        until: Option<Instant>,
    },
}

/// One connection's hold. Clones share it.
#[derive(Debug, Clone)]
pub struct Fence(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    hold: watch::Sender<Hold>,
    terms: AtomicU64,
}

impl Hold {
    /// The term held at `now`, if any.
    fn term(&self, now: Instant) -> Option<u64> {
        match *self {
            Hold::Held { term, until, .. } if until.is_none_or(|u| now < u) => Some(term),
            _ => None,
        }
    }
}

impl Fence {
    fn new(hold: Hold) -> Fence {
        Fence(Arc::new(Shared {
            hold: watch::Sender::new(hold),
            terms: AtomicU64::new(1),
        }))
    }

    /// Held for ever: a process that shares its clusters with nobody.
    pub fn always() -> Fence {
        Fence::new(Hold::Held {
            generation: 0,
            term: 0,
            until: None,
        })
    }

    /// Not held until [`Fence::grant`]ed.
    pub fn released() -> Fence {
        Fence::new(Hold::Released)
    }

    /// The lease generation held now; `None` when released or expired.
    pub fn generation(&self) -> Option<u64> {
        let hold = *self.0.hold.borrow();
        hold.term(Instant::now()).and(match hold {
            Hold::Held { generation, .. } => Some(generation),
            Hold::Released => None,
        })
    }

    /// The unbroken hold this is (see [`Hold::Held`]); `None` when not held.
    pub fn term(&self) -> Option<u64> {
        self.0.hold.borrow().term(Instant::now())
    }

    /// Held under `generation` until `until`: the same term if it is held under that
    /// generation now, else a new one.
    pub fn grant(&self, generation: u64, until: Instant) {
        self.0.hold.send_modify(|hold| {
            let same = match *hold {
                Hold::Held { generation: g, .. } => g == generation,
                Hold::Released => false,
            };
            let term = match hold.term(Instant::now()) {
                Some(term) if same => term,
                _ => self.0.terms.fetch_add(1, Ordering::Relaxed),
            };
            *hold = Hold::Held {
                generation,
                term,
                until: Some(until),
            };
        });
    }

    /// No longer held, from now.
    pub fn release(&self) {
        self.0.hold.send_if_modified(|hold| {
            let was = *hold != Hold::Released;
            *hold = Hold::Released;
            was
        });
    }

    /// Resolves once the fence is not held: released, or past its `until`. What every watch
    /// of the connection runs beside, so that it ends at that instant.
    pub async fn lost(&self) {
        let mut rx = self.0.hold.subscribe();
        loop {
            let hold = *rx.borrow_and_update();
            match hold {
                Hold::Released => return,
                Hold::Held { until: None, .. } => {
                    if rx.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
                Hold::Held {
                    until: Some(until), ..
                } => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until) => return,
                        changed = rx.changed() => if changed.is_err() { return },
                    }
                }
            }
        }
    }
    /// Resolves once the term held ([`Fence::term`]) is other than `from`: a new hold, or
    /// the hold lost (released, or run out). What the watch cache follows to start its
    /// namespaces over under a new hold, rather than wait for their next reader.
    pub async fn term_changed(&self, from: Option<u64>) {
        let mut rx = self.0.hold.subscribe();
        loop {
            let hold = *rx.borrow_and_update();
            let now = hold.term(Instant::now());
            if now != from {
                return;
            }
            let until = match hold {
                Hold::Held { until, .. } if now.is_some() => until,
                _ => None,
            };
            let changed = async {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            match until {
                Some(until) => tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    () = changed => {}
                },
                None => changed.await,
            }
        }
    }
}

/// The fences of a process' connections, by key (a connection's `source`: the same on every
/// replica with the same configuration). Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Fences(Option<Arc<Mutex<HashMap<String, Fence>>>>);

impl Fences {
    /// Every fence held for ever: a process alone on its clusters.
    pub fn solo() -> Fences {
        Fences(None)
    }

    /// Fences released until the replicas' coordination grants them.
    pub fn shared() -> Fences {
        Fences(Some(Arc::default()))
    }

    /// The fence of connection `key`; the same one for every caller.
    pub fn fence(&self, key: &str) -> Fence {
        match &self.0 {
            None => Fence::always(),
            Some(all) => all
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key.to_owned())
                .or_insert_with(Fence::released)
                .clone(),
        }
    }

    /// Every connection known here, with its fence (none for a solo process).
    pub fn all(&self) -> Vec<(String, Fence)> {
        match &self.0 {
            None => Vec::new(),
            Some(all) => {
                let all = all.lock().unwrap_or_else(|e| e.into_inner());
                let mut all: Vec<_> = all.iter().map(|(k, f)| (k.clone(), f.clone())).collect();
                all.sort_by(|a, b| a.0.cmp(&b.0));
                all
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_granted_fence_expires_by_itself_and_wakes_its_watches() {
        let fence = Fence::released();
        assert_eq!(fence.generation(), None);
        fence.grant(3, Instant::now() + Duration::from_secs(8));
        assert_eq!(fence.generation(), Some(3));
        let lost = tokio::spawn({
            let fence = fence.clone();
            async move {
                fence.lost().await;
                Instant::now()
            }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Renewed: the watches go on past the first deadline.
        fence.grant(3, Instant::now() + Duration::from_secs(8));
        let started = Instant::now();
        let ended = lost.await.unwrap();
        assert_eq!(ended - started, Duration::from_secs(8));
        assert_eq!(fence.generation(), None);
        let term = fence.term();
        assert_eq!(term, None);
        // Held again under the same generation: a new term, as the watches stopped meanwhile.
        fence.grant(3, Instant::now() + Duration::from_secs(8));
        let again = fence.term().unwrap();
        fence.grant(3, Instant::now() + Duration::from_secs(8));
        assert_eq!(fence.term(), Some(again));
        fence.grant(4, Instant::now() + Duration::from_secs(8));
        assert_ne!(fence.term(), Some(again));
    }

    #[tokio::test(start_paused = true)]
    async fn released_is_lost_at_once_and_always_is_never_lost() {
        let fence = Fence::always();
        fence.release();
        tokio::time::timeout(Duration::from_millis(1), fence.lost())
            .await
            .expect("lost at once");
        let always = Fence::always();
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), always.lost())
                .await
                .is_err()
        );
        assert_eq!(always.generation(), Some(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_of_term_is_told_when_lost_and_when_held_again() {
        let fence = Fence::released();
        let changed = |from| {
            let fence = fence.clone();
            tokio::spawn(async move { fence.term_changed(from).await })
        };
        // Released: told when granted.
        let granted = changed(None);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!granted.is_finished());
        fence.grant(1, Instant::now() + Duration::from_secs(8));
        granted.await.unwrap();
        let term = fence.term();
        // Renewed under the same term: not told; run out: told at that instant.
        let lost = changed(term);
        tokio::time::sleep(Duration::from_secs(5)).await;
        fence.grant(1, Instant::now() + Duration::from_secs(8));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!lost.is_finished());
        let started = Instant::now();
        lost.await.unwrap();
        assert_eq!(Instant::now() - started, Duration::from_secs(3));
        // Run out, then held again under the same generation: a new term, told.
        let again = changed(None);
        fence.grant(1, Instant::now() + Duration::from_secs(8));
        again.await.unwrap();
        assert_ne!(fence.term(), term);
        // Already other than asked: at once.
        tokio::time::timeout(Duration::from_millis(1), fence.term_changed(term))
            .await
            .expect("at once");
    }

    #[test]
    fn shared_fences_are_one_per_key_and_solo_ones_always_held() {
        let shared = Fences::shared();
        shared
            .fence("a")
            .grant(1, Instant::now() + Duration::from_secs(60));
        assert_eq!(shared.fence("a").generation(), Some(1));
        assert_eq!(shared.fence("b").generation(), None);
        let keys: Vec<_> = shared.all().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(Fences::solo().fence("a").generation(), Some(0));
        assert!(Fences::solo().all().is_empty());
    }
}
