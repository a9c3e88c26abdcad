//! Pod log text per container, and a broadcast of appended text for `follow=true` readers.
//!
//! A log stored without a container name ("") stands for every container of the pod, so a test
//! that does not care about containers can call `set_pod_log(ns, pod, None, ..)` and still
//! answer `kubectl logs`, which always names a container.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::broadcast;

#[derive(Debug)]
pub(crate) struct Chunk {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub text: String,
}

pub(crate) struct Logs {
    /// `(namespace, pod)` → container ("" = any) → text.
    text: Mutex<HashMap<(String, String), BTreeMap<String, String>>>,
    /// `(namespace, pod, container)` → the log of the container's previous, terminated run
    /// (what `previous=true` reads).
    previous: Mutex<HashMap<(String, String, String), String>>,
    tx: broadcast::Sender<Arc<Chunk>>,
}

impl Logs {
    pub fn new() -> Self {
        Logs {
            text: Mutex::new(HashMap::new()),
            previous: Mutex::new(HashMap::new()),
            tx: broadcast::channel(1024).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), BTreeMap<String, String>>> {
        self.text.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_previous(&self, ns: &str, pod: &str, container: &str, text: &str) {
        self.previous
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((ns.into(), pod.into(), container.into()), text.into());
    }

    pub fn previous(&self, ns: &str, pod: &str, container: &str) -> Option<String> {
        self.previous
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(ns.into(), pod.into(), container.into()))
            .cloned()
    }

    pub fn has_any(&self, ns: &str, pod: &str) -> bool {
        self.lock()
            .get(&(ns.to_string(), pod.to_string()))
            .is_some_and(|m| !m.is_empty())
    }

    pub fn set(&self, ns: &str, pod: &str, container: Option<&str>, text: &str) {
        self.lock()
            .entry((ns.to_string(), pod.to_string()))
            .or_default()
            .insert(container.unwrap_or("").to_string(), text.to_string());
    }

    /// Appends to the pod's one stored log, else its "" log, else `default_container`'s.
    pub fn append(&self, ns: &str, pod: &str, default_container: Option<&str>, text: &str) {
        let mut all = self.lock();
        let logs = all.entry((ns.to_string(), pod.to_string())).or_default();
        let key = if logs.len() == 1 {
            logs.keys().next().cloned().unwrap_or_default()
        } else if logs.contains_key("") {
            String::new()
        } else {
            match default_container {
                Some(c) => c.to_string(),
                None => logs.keys().next().cloned().unwrap_or_default(),
            }
        };
        logs.entry(key.clone()).or_default().push_str(text);
        // Sent under the lock so a follower never misses or doubles a chunk.
        let _ = self.tx.send(Arc::new(Chunk {
            namespace: ns.to_string(),
            pod: pod.to_string(),
            container: key,
            text: text.to_string(),
        }));
    }

    /// The text for `container` (falling back to the "" log) and the key it was read from,
    /// plus a receiver for later appends, taken atomically.
    pub fn read(
        &self,
        ns: &str,
        pod: &str,
        container: Option<&str>,
    ) -> (String, String, broadcast::Receiver<Arc<Chunk>>) {
        let all = self.lock();
        let rx = self.tx.subscribe();
        let logs = all.get(&(ns.to_string(), pod.to_string()));
        let key = match (container, logs) {
            (Some(c), Some(l)) if l.contains_key(c) => c.to_string(),
            (Some(c), Some(l)) if !l.contains_key("") => c.to_string(),
            (Some(c), None) => c.to_string(),
            (None, Some(l)) if l.len() == 1 => l.keys().next().cloned().unwrap_or_default(),
            _ => String::new(),
        };
        let text = logs.and_then(|l| l.get(&key)).cloned().unwrap_or_default();
        (key, text, rx)
    }
}

/// The last `n` lines of `text` (a trailing partial line counts as a line).
pub(crate) fn tail(text: &str, n: usize) -> &str {
    if n == 0 {
        return "";
    }
    let mut seen = 0;
    let body = text.strip_suffix('\n').unwrap_or(text);
    for (i, c) in body.char_indices().rev() {
        if c == '\n' {
            seen += 1;
            if seen == n {
                return &text[i + 1..];
            }
        }
    }
    text
}
