//! The last group each forwarded view was answered with, on both sides of the hop (SPEC 16):
//! the owner keeps the bytes it encoded of its watch cache's group (its memo), and the replica
//! that asked keeps the group it decoded of them, each under the bytes' tag. While nothing
//! changes, the asking replica sends the tag it has (`If-None-Match`), the owner, once it has
//! judged the viewer as always, answers `304 Not Modified` when its group still encodes to that
//! tag, and neither encodes, sends nor decodes the group again. The tag is a hash of the bytes,
//! so a copy under it is the owner's answer byte for byte, whoever asked for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::forward::GroupAsk;
use super::wire;
use crate::resources::group::ResourceGroup;

/// Asks remembered on each side, past which a memo starts over.
const MAX_ENTRIES: usize = 1024;
/// Bytes of encoded groups remembered on each side, past which a memo starts over.
const MAX_BYTES: usize = 64 * 1024 * 1024;

/// A group as encoded for the wire, and its tag.
#[derive(Clone)]
pub struct Encoded {
    pub bytes: Bytes,
    pub tag: String,
}

/// The tag of an encoded group: the first 128 bits of its SHA-256, in hex, quoted as an
/// entity tag is.
pub fn tag(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// Per ask, a value and the bytes it stands for; bounded by [`MAX_ENTRIES`] and [`MAX_BYTES`].
struct Bounded<V> {
    entries: Mutex<Entries<V>>,
}

/// Per ask, a value and its bytes; and the bytes of all.
type Entries<V> = (HashMap<String, (V, usize)>, usize);

impl<V: Clone> Bounded<V> {
    fn new() -> Self {
        Bounded {
            entries: Mutex::new((HashMap::new(), 0)),
        }
    }

    fn get(&self, key: &str) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.0.get(key).map(|(v, _)| v.clone())
    }

    fn put(&self, key: String, value: V, size: usize) {
        if size > MAX_BYTES {
            return;
        }
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (entries, total) = &mut *guard;
        if let Some((_, old)) = entries.remove(&key) {
            *total -= old;
        }
        if entries.len() >= MAX_ENTRIES || *total + size > MAX_BYTES {
            entries.clear();
            *total = 0;
        }
        entries.insert(key, (value, size));
        *total += size;
    }
}

/// The key of an ask: the agent, its namespaces in order, the selector.
fn key(ask: &GroupAsk) -> String {
    let mut key = format!("{}\n{}", ask.agent, ask.selector);
    for namespace in &ask.namespaces {
        key.push('\n');
        key.push_str(namespace);
    }
    key
}

/// The owner's side: the encoding of the group last answered per ask, good while the watch
/// cache answers that very group (the same `Arc`).
pub struct Encodings(Bounded<(Arc<ResourceGroup>, Encoded)>);

impl Default for Encodings {
    fn default() -> Self {
        Encodings(Bounded::new())
    }
}

impl Encodings {
    /// `group` encoded, from the memo when it is the group last encoded for `ask`.
    pub fn encode(
        &self,
        ask: &GroupAsk,
        group: &Arc<ResourceGroup>,
    ) -> serde_json::Result<Encoded> {
        let key = key(ask);
        if let Some((kept, encoded)) = self.0.get(&key) {
            if Arc::ptr_eq(&kept, group) {
                return Ok(encoded);
            }
        }
        let bytes = Bytes::from(wire::encode(group)?);
        let encoded = Encoded {
            tag: tag(&bytes),
            bytes,
        };
        let size = encoded.bytes.len();
        self.0.put(key, (group.clone(), encoded.clone()), size);
        Ok(encoded)
    }
}

/// The asking replica's side: the group last received per ask, under its tag.
pub struct Received(Bounded<(String, Arc<ResourceGroup>)>);

impl Default for Received {
    fn default() -> Self {
        Received(Bounded::new())
    }
}

impl Received {
    /// The tag and group last received for `ask`.
    pub fn get(&self, ask: &GroupAsk) -> Option<(String, Arc<ResourceGroup>)> {
        self.0.get(&key(ask))
    }

    /// The group `bytes` decode to, received for `ask`, kept under their tag.
    pub fn decode(&self, ask: &GroupAsk, bytes: &[u8]) -> Result<Arc<ResourceGroup>, String> {
        let group = Arc::new(wire::decode(bytes)?);
        self.0
            .put(key(ask), (tag(bytes), group.clone()), bytes.len());
        Ok(group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(namespaces: &[&str]) -> GroupAsk {
        GroupAsk {
            agent: 7,
            namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            selector: "app=web".into(),
        }
    }

    #[test]
    fn the_owner_encodes_a_group_once_and_again_when_it_is_another() {
        let encodings = Encodings::default();
        let group = Arc::new(ResourceGroup::unreadable(
            "prod",
            "app=web",
            503,
            "x".into(),
        ));
        let first = encodings.encode(&ask(&["prod"]), &group).unwrap();
        let again = encodings.encode(&ask(&["prod"]), &group).unwrap();
        assert_eq!(first.bytes.as_ptr(), again.bytes.as_ptr(), "encoded again");
        assert_eq!(first.tag, tag(&first.bytes));
        // Another group (a change): encoded afresh, its own tag.
        let changed = Arc::new(ResourceGroup::unreadable(
            "prod",
            "app=web",
            503,
            "y".into(),
        ));
        let other = encodings.encode(&ask(&["prod"]), &changed).unwrap();
        assert_ne!(other.tag, first.tag);
        // The same content in another Arc is encoded again, to the same tag.
        let copy = Arc::new((*group).clone());
        assert_eq!(
            encodings.encode(&ask(&["prod"]), &copy).unwrap().tag,
            first.tag
        );
    }

    #[test]
    fn the_asker_keeps_what_it_decoded_under_its_tag_per_ask() {
        let received = Received::default();
        let group = ResourceGroup::unreadable("prod", "app=web", 503, "x".into());
        let bytes = wire::encode(&group).unwrap();
        assert!(received.get(&ask(&["prod"])).is_none());
        let decoded = received.decode(&ask(&["prod"]), &bytes).unwrap();
        let (kept_tag, kept) = received.get(&ask(&["prod"])).unwrap();
        assert_eq!(kept_tag, tag(&bytes));
        assert!(Arc::ptr_eq(&kept, &decoded));
        assert!(received.get(&ask(&["prod", "extra"])).is_none());
        assert!(received.decode(&ask(&["x"]), b"not a group").is_err());
        assert!(received.get(&ask(&["x"])).is_none());
    }

    #[test]
    fn a_memo_is_bounded() {
        let bounded = Bounded::<u8>::new();
        for i in 0..MAX_ENTRIES + 10 {
            bounded.put(i.to_string(), 1, 10);
        }
        assert!(bounded.entries.lock().unwrap().0.len() <= MAX_ENTRIES);
        bounded.put("big".into(), 1, MAX_BYTES + 1);
        assert!(bounded.get("big").is_none());
        bounded.put("a".into(), 1, MAX_BYTES / 2 + 1);
        bounded.put("b".into(), 2, MAX_BYTES / 2 + 1);
        let (entries, total) = &*bounded.entries.lock().unwrap();
        assert!(*total <= MAX_BYTES && entries.len() == 1, "{total}");
    }
}
