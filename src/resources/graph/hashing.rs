//! Hashing and the hash-indexed tables of the graph: computed once per string, while the string
//! is in cache.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};

use super::NONE;

/// FxHash's multiply-rotate step (as in rustc), over 8-byte words: much cheaper than SipHash on short keys.
/// Flooding resistance buys nothing here: keys come from the user's own environment, and a collision costs
/// a string comparison, never a wrong answer.
fn mix(hash: u64, word: u64) -> u64 {
    (hash.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

pub(super) fn hash_strs(parts: &[&str]) -> u64 {
    let mut hash = 0;
    for part in parts {
        let bytes = part.as_bytes();
        let n = bytes.len();
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        let half = |at: usize| {
            u64::from(u32::from_le_bytes(
                bytes[at..at + 4].try_into().unwrap_or_default(),
            ))
        };
        if n >= 8 {
            for at in (0..n - 7).step_by(8) {
                hash = mix(hash, word(at));
            }
            if n % 8 != 0 {
                // The last 8 bytes, overlapping the previous word: no copy of a short tail.
                hash = mix(hash, word(n - 8));
            }
        } else if n >= 4 {
            hash = mix(hash, half(0) | half(n - 4) << 32);
        } else if n > 0 {
            let byte = |at: usize| u64::from(bytes[at]);
            hash = mix(hash, byte(0) | byte(n / 2) << 8 | byte(n - 1) << 16);
        }
        hash = mix(hash, n as u64);
    }
    // The multiply leaves the low bits weak, and hash tables pick buckets by them.
    hash.rotate_left(26)
}

/// Hasher for keys that already are hashes.
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = mix(self.0, u64::from(byte));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub(super) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
pub(super) type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

pub(super) fn id_set<K>(capacity: usize) -> IdSet<K> {
    IdSet::with_capacity_and_hasher(capacity, Default::default())
}

/// A key with its hash: equality checks the hash first and only then the strings.
#[derive(Clone, Copy, Debug)]
pub(super) struct Hashed<K> {
    pub(super) hash: u64,
    pub(super) key: K,
}

impl<K: PartialEq> PartialEq for Hashed<K> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.key == other.key
    }
}

impl<K: PartialEq> Eq for Hashed<K> {}

impl<K> Hash for Hashed<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

pub(super) fn uid_prefix(uid: &str) -> u64 {
    let mut word = [0u8; 8];
    let len = uid.len().min(8);
    word[..len].copy_from_slice(&uid.as_bytes()[..len]);
    u64::from_be_bytes(word)
}

/// A multimap from hashed keys to object indices, as linked chains in one `Vec`: no allocation per key, and
/// the key strings are compared only for entries whose full hash matches.
pub(super) struct Chains<K> {
    heads: IdMap<u64, u32>,
    /// `(key, value, next entry)`.
    entries: Vec<(K, u32, u32)>,
}

impl<K: PartialEq + Copy> Chains<K> {
    pub(super) fn new() -> Self {
        Chains::with_capacity(0)
    }

    pub(super) fn with_capacity(keys: usize) -> Self {
        Chains {
            heads: IdMap::with_capacity_and_hasher(keys, Default::default()),
            entries: Vec::with_capacity(keys),
        }
    }

    pub(super) fn insert(&mut self, key: Hashed<K>, value: u32) {
        let next = self
            .heads
            .insert(key.hash, self.entries.len() as u32)
            .unwrap_or(NONE);
        self.entries.push((key.key, value, next));
    }

    pub(super) fn get(&self, key: Hashed<K>) -> impl Iterator<Item = u32> + '_ {
        let mut at = self.heads.get(&key.hash).copied().unwrap_or(NONE);
        std::iter::from_fn(move || {
            while let Some(&(entry_key, value, next)) = self.entries.get(at as usize) {
                at = next;
                if entry_key == key.key {
                    return Some(value);
                }
            }
            None
        })
    }
}

impl<K: PartialEq + Copy> Chains<K> {
    pub(super) fn insert_some(&mut self, key: Option<Hashed<K>>, value: u32) {
        if let Some(key) = key {
            self.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_compare_keys_not_just_hashes() {
        let mut chains: Chains<&str> = Chains::new();
        chains.insert(Hashed { hash: 7, key: "a" }, 1);
        chains.insert(Hashed { hash: 7, key: "b" }, 2);
        chains.insert(Hashed { hash: 7, key: "a" }, 3);
        let mut found: Vec<u32> = chains.get(Hashed { hash: 7, key: "a" }).collect();
        found.sort_unstable();
        assert_eq!(found, [1, 3]);
        assert_eq!(chains.get(Hashed { hash: 8, key: "a" }).count(), 0);
        let set: IdSet<Hashed<&str>> = [Hashed { hash: 1, key: "x" }, Hashed { hash: 1, key: "y" }]
            .into_iter()
            .collect();
        assert_eq!(set.len(), 2);
    }
}
