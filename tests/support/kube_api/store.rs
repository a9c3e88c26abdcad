//! Object storage with a single resourceVersion counter, an event history for watches that resume
//! from a resourceVersion, and a broadcast channel for live watchers.
//!
//! Every write goes through [`Store::write`], which holds the lock while it assigns the new
//! resourceVersion, records the event and broadcasts it, so a watcher that subscribes under the
//! same lock sees each change exactly once.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::broadcast;

/// `(group, plural)`.
pub(crate) type ResKey = (String, String);
/// `(namespace, name)`; namespace is "" for cluster-scoped objects. Ordered like etcd keys.
pub(crate) type ObjKey = (String, String);

/// Events kept for watches that resume from an older resourceVersion; older ones get 410 Gone.
const HISTORY: usize = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug)]
pub(crate) struct Event {
    pub rv: u64,
    pub res: ResKey,
    pub kind: EventType,
    pub object: Arc<Value>,
    /// The object before the change, so a filtered watch can turn "stopped matching" into DELETED.
    pub prev: Option<Arc<Value>>,
}

/// What a write closure decides.
pub(crate) enum Write {
    Put(Value),
    Delete,
    /// `dryRun=All`: answer with this object but change nothing.
    DryRun(Value),
}

struct State {
    rv: u64,
    objects: HashMap<ResKey, BTreeMap<ObjKey, Arc<Value>>>,
    history: VecDeque<Arc<Event>>,
    /// Highest resourceVersion whose event was dropped from `history`.
    history_floor: u64,
}

pub(crate) struct Store {
    state: Mutex<State>,
    tx: broadcast::Sender<Arc<Event>>,
}

/// A consistent view for starting a watch.
pub(crate) struct Subscription {
    pub rx: broadcast::Receiver<Arc<Event>>,
    /// Current objects (when the watch asked for initial state) or replayed events (when it
    /// resumed from a resourceVersion), oldest first.
    pub initial: Vec<Arc<Event>>,
    pub rv: u64,
}

impl Store {
    pub fn new() -> Self {
        Store {
            state: Mutex::new(State {
                rv: 1,
                objects: HashMap::new(),
                history: VecDeque::new(),
                history_floor: 0,
            }),
            tx: broadcast::channel(4096).0,
        }
    }

    /// A poisoned lock only means another test thread panicked; the data is still usable.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// Drops the event history: resuming from any version before the current one is 410 Gone.
    pub fn compact(&self) {
        let mut st = self.lock();
        st.history.clear();
        st.history_floor = st.rv;
    }

    pub fn get(&self, res: &ResKey, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.lock()
            .objects
            .get(res)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
    }

    /// Objects of one resource, in `(namespace, name)` order, optionally one namespace only.
    pub fn list(&self, res: &ResKey, ns: Option<&str>) -> (u64, Vec<(ObjKey, Arc<Value>)>) {
        let st = self.lock();
        let items = match st.objects.get(res) {
            None => Vec::new(),
            Some(m) => match ns {
                Some(ns) => m
                    .range((ns.to_string(), String::new())..)
                    .take_while(|((n, _), _)| n == ns)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                None => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            },
        };
        (st.rv, items)
    }

    /// Every stored object key in a namespace, across resources (for namespace deletion).
    pub fn keys_in_namespace(&self, ns: &str) -> Vec<(ResKey, String)> {
        let st = self.lock();
        let mut out = Vec::new();
        for (res, m) in &st.objects {
            for (n, name) in m.keys() {
                if n == ns {
                    out.push((res.clone(), name.clone()));
                }
            }
        }
        out
    }

    /// Atomically reads the current object, lets `f` decide, and applies the outcome.
    /// `f` gets the current object and the resourceVersion the write will carry; it should put
    /// that version into the object's metadata. Returns the stored (or deleted) object.
    pub fn write<E>(
        &self,
        res: &ResKey,
        ns: &str,
        name: &str,
        f: impl FnOnce(Option<&Value>, u64) -> Result<Write, E>,
    ) -> Result<Arc<Value>, E> {
        let mut st = self.lock();
        let rv = st.rv + 1;
        let key = (ns.to_string(), name.to_string());
        let prev = st.objects.get(res).and_then(|m| m.get(&key)).cloned();
        let decision = f(prev.as_deref(), rv)?;
        let (kind, object) = match decision {
            Write::DryRun(obj) => return Ok(Arc::new(obj)),
            Write::Put(obj) => {
                let obj = Arc::new(obj);
                st.objects
                    .entry(res.clone())
                    .or_default()
                    .insert(key, obj.clone());
                let kind = if prev.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                (kind, obj)
            }
            Write::Delete => {
                let Some(old) = prev.clone() else {
                    // Nothing to delete: the closure should have returned an error instead.
                    return Ok(Arc::new(Value::Null));
                };
                if let Some(m) = st.objects.get_mut(res) {
                    m.remove(&key);
                }
                let mut gone = (*old).clone();
                set_rv(&mut gone, rv);
                (EventType::Deleted, Arc::new(gone))
            }
        };
        st.rv = rv;
        let event = Arc::new(Event {
            rv,
            res: res.clone(),
            kind,
            object: object.clone(),
            prev,
        });
        st.history.push_back(event.clone());
        if st.history.len() > HISTORY {
            if let Some(old) = st.history.pop_front() {
                st.history_floor = old.rv;
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(event);
        Ok(object)
    }

    /// Starts a watch. `since: None` means "send the current state first"; `Some(rv)` replays
    /// the history after `rv`, or fails with the oldest version still known if it is gone.
    pub fn subscribe(
        &self,
        res: &ResKey,
        ns: Option<&str>,
        since: Option<u64>,
    ) -> Result<Subscription, u64> {
        let st = self.lock();
        let rx = self.tx.subscribe();
        let initial = match since {
            None => st
                .objects
                .get(res)
                .into_iter()
                .flat_map(|m| m.iter())
                .filter(|((n, _), _)| ns.is_none_or(|ns| ns == n))
                .map(|(_, obj)| {
                    Arc::new(Event {
                        rv: st.rv,
                        res: res.clone(),
                        kind: EventType::Added,
                        object: obj.clone(),
                        prev: None,
                    })
                })
                .collect(),
            Some(since) => {
                if since < st.history_floor {
                    return Err(st.history_floor + 1);
                }
                st.history
                    .iter()
                    .filter(|e| e.rv > since && &e.res == res)
                    .cloned()
                    .collect()
            }
        };
        Ok(Subscription {
            rx,
            initial,
            rv: st.rv,
        })
    }
}

pub(crate) fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}
