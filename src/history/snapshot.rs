//! What a snapshot keeps of a resource group, and how it is stored (SPEC 10). Pure.
//!
//! A manifest loses what the cluster writes (so that two snapshots of an unchanged resource
//! are equal), is masked like every manifest envlens shows (SPEC 5.2), and is keyed by the
//! SHA-256 of its canonical JSON (keys sorted, no spaces): equal content, equal key, stored
//! once. A snapshot's resources, sorted by identity, are cut into chunks at resources whose
//! identity hash ends in [`CHUNK_BITS`] zero bits: the cuts depend on the resources alone, not
//! on their positions, so adding or changing one resource changes one chunk and leaves the
//! others (and their storage) shared with the previous snapshot.
//!
//! Compression is deflate (`miniz_oxide`, pure Rust, no C to build): manifests are small JSON
//! documents where deflate gets most of what zstd would without a dictionary.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::resources::group::{Resource, ResourceGroup};
use crate::resources::health::HealthStatus;
use crate::resources::masking::mask_secret;

/// The `metadata` fields the cluster writes. `managedFields` is server-side apply's bookkeeping.
const CLUSTER_METADATA: [&str; 8] = [
    "managedFields",
    "resourceVersion",
    "generation",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

/// A chunk is cut after a resource whose identity hash has this many low zero bits: 64
/// resources per chunk on average, about 16 chunks for a group of a thousand.
const CHUNK_BITS: u32 = 6;

/// The most a compressed document may inflate to when read back (a guard against a corrupt
/// row, far above any manifest the API server accepts, 1.5 MB by default in etcd).
const MAX_INFLATED: usize = 64 << 20;

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// `manifest` without what the cluster writes: `status`, the metadata of
/// [`CLUSTER_METADATA`], and a Secret's values masked.
pub fn strip(mut manifest: Value) -> Value {
    if let Value::Object(object) = &mut manifest {
        object.remove("status");
        if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
            for field in CLUSTER_METADATA {
                metadata.remove(field);
            }
        }
    }
    mask_secret(&mut manifest);
    manifest
}

/// The canonical JSON text of `value`: object keys sorted by their UTF-8 bytes, no whitespace,
/// numbers and strings as serde_json writes them. Independent of serde_json's map order.
pub fn canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // A string always serializes.
                serde_json::to_writer(&mut *out, key).unwrap_or_default();
                out.push(b':');
                write_canonical(&map[key], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar).unwrap_or_default(),
    }
}

pub fn sha256(bytes: &[u8]) -> Hash {
    Sha256::digest(bytes).into()
}

pub fn compress(bytes: &[u8]) -> Vec<u8> {
    miniz_oxide::deflate::compress_to_vec(bytes, 6)
}

pub fn decompress(bytes: &[u8]) -> Result<Vec<u8>, String> {
    miniz_oxide::inflate::decompress_to_vec_with_limit(bytes, MAX_INFLATED)
        .map_err(|e| format!("a stored snapshot does not inflate: {e:?}"))
}

/// One resource of a snapshot: who it is, its health then, and its manifest's hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(rename = "v")]
    pub api_version: String,
    #[serde(rename = "k")]
    pub kind: String,
    #[serde(rename = "ns", default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(rename = "n")]
    pub name: String,
    #[serde(rename = "u")]
    pub uid: String,
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(rename = "h", default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthStatus>,
    #[serde(rename = "hm", default, skip_serializing_if = "Option::is_none")]
    pub health_message: Option<String>,
    /// The manifest's hash, in hex.
    #[serde(rename = "m")]
    pub manifest: String,
}

/// What identifies a resource across snapshots: its type, namespace and name (a uid changes
/// when a resource is deleted and created again, which is still the same resource to a reader).
pub type Key<'a> = (&'a str, &'a str, Option<&'a str>, &'a str);

impl Entry {
    pub fn key(&self) -> Key<'_> {
        (
            &self.api_version,
            &self.kind,
            self.namespace.as_deref(),
            &self.name,
        )
    }
}

/// A resource group as a snapshot stores it: sorted entries and the manifests they name.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub health: HealthStatus,
    pub health_message: Option<String>,
    pub entries: Vec<Entry>,
    /// Canonical JSON by hash.
    pub manifests: BTreeMap<Hash, Vec<u8>>,
}

/// A snapshot of `group`: each manifest stripped, hashed and kept once.
pub fn take(group: &ResourceGroup) -> Snapshot {
    let mut manifests = BTreeMap::new();
    let mut entries: Vec<Entry> = group
        .resources
        .iter()
        .map(|r| entry(r, &mut manifests))
        .collect();
    entries.sort_by(|a, b| a.key().cmp(&b.key()));
    entries.dedup_by(|a, b| a.key() == b.key());
    Snapshot {
        health: group.health.status,
        health_message: group.health.message.clone(),
        entries,
        manifests,
    }
}

fn entry(r: &Resource, manifests: &mut BTreeMap<Hash, Vec<u8>>) -> Entry {
    let text = canonical(&strip(r.object.manifest()));
    let hash = sha256(&text);
    manifests.entry(hash).or_insert(text);
    Entry {
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        uid: r.uid.clone(),
        created_at: r.created_at,
        health: r.health.as_ref().map(|h| h.status),
        health_message: r.health.as_ref().and_then(|h| h.message.clone()),
        manifest: hex(&hash),
    }
}

/// A chunk as stored: its hash and compressed body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub hash: Hash,
    pub body: Vec<u8>,
}

/// Cuts sorted `entries` into chunks where an identity's hash says so (see the module's doc).
pub fn chunks(entries: &[Entry]) -> Vec<Chunk> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, e) in entries.iter().enumerate() {
        let last = i + 1 == entries.len();
        if last || cuts_after(e) {
            let json = serde_json::to_vec(&entries[start..=i]).unwrap_or_default();
            out.push(Chunk {
                hash: sha256(&json),
                body: compress(&json),
            });
            start = i + 1;
        }
    }
    out
}

fn cuts_after(e: &Entry) -> bool {
    let mut hasher = Sha256::new();
    for part in [
        e.api_version.as_str(),
        &e.kind,
        e.namespace.as_deref().unwrap_or(""),
        &e.name,
    ] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest: Hash = hasher.finalize().into();
    u64::from_le_bytes(digest[..8].try_into().unwrap_or_default()) & ((1 << CHUNK_BITS) - 1) == 0
}

/// The entries of stored chunks, in order.
pub fn read_chunks(bodies: &[Vec<u8>]) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    for body in bodies {
        let json = decompress(body)?;
        let mut part: Vec<Entry> = serde_json::from_slice(&json)
            .map_err(|e| format!("a stored snapshot chunk does not parse: {e}"))?;
        entries.append(&mut part);
    }
    Ok(entries)
}

pub fn hex(hash: &Hash) -> String {
    use std::fmt::Write;
    hash.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

pub fn unhex(s: &str) -> Option<Hash> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut hash = [0; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(hash)
}

/// The status as stored (Argo CD's spelling), and back.
pub fn parse_health(s: &str) -> Option<HealthStatus> {
    [
        HealthStatus::Healthy,
        HealthStatus::Suspended,
        HealthStatus::Progressing,
        HealthStatus::Missing,
        HealthStatus::Degraded,
        HealthStatus::Unknown,
    ]
    .into_iter()
    .find(|h| h.as_str() == s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strip_drops_what_the_cluster_writes_and_keeps_the_rest() {
        let live = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "42",
                         "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z",
                         "selfLink": "/apis/apps/v1/x", "managedFields": [{"manager": "kubectl"}],
                         "labels": {"app": "web"}, "annotations": {"a": "b"}},
            "spec": {"replicas": 2},
            "status": {"readyReplicas": 2}
        });
        assert_eq!(
            strip(live),
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"},
                                "annotations": {"a": "b"}},
                   "spec": {"replicas": 2}})
        );
    }

    #[test]
    fn strip_masks_secrets() {
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                            "data": {"password": "aHVudGVyMg=="}, "stringData": {"token": "t"}});
        let stripped = strip(secret);
        assert_eq!(stripped["data"]["password"], "++++++++");
        assert_eq!(stripped["stringData"]["token"], "++++++++");
        assert!(!String::from_utf8(canonical(&stripped))
            .unwrap()
            .contains("aHVudGVyMg"));
    }

    #[test]
    fn canonical_sorts_keys_at_every_depth() {
        let a = json!({"b": 1, "a": {"y": [2, {"d": 1, "c": null}], "x": "é\"q"}});
        assert_eq!(
            String::from_utf8(canonical(&a)).unwrap(),
            r#"{"a":{"x":"é\"q","y":[2,{"c":null,"d":1}]},"b":1}"#
        );
        let reparsed: Value = serde_json::from_slice(&canonical(&a)).unwrap();
        assert_eq!(reparsed, a);
    }

    #[test]
    fn equal_content_has_equal_hashes_whatever_the_order() {
        let one: Value = serde_json::from_str(r#"{"a":1,"b":{"c":2,"d":3}}"#).unwrap();
        let two: Value = serde_json::from_str(r#"{"b":{"d":3,"c":2},"a":1}"#).unwrap();
        assert_eq!(sha256(&canonical(&one)), sha256(&canonical(&two)));
        let three = json!({"a": 1, "b": {"c": 2, "d": 4}});
        assert_ne!(sha256(&canonical(&one)), sha256(&canonical(&three)));
    }

    #[test]
    fn compression_round_trips() {
        let containers = vec![json!({"name": "a", "image": "x:1"}); 20];
        let text = canonical(&json!({"spec": {"containers": containers}}));
        let packed = compress(&text);
        assert!(
            packed.len() < text.len() / 3,
            "{} of {}",
            packed.len(),
            text.len()
        );
        assert_eq!(decompress(&packed).unwrap(), text);
        assert!(decompress(b"not deflate at all").is_err());
    }

    #[test]
    fn hex_round_trips() {
        let h = sha256(b"x");
        assert_eq!(unhex(&hex(&h)), Some(h));
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex(&"g".repeat(64)), None);
    }

    pub(crate) fn entries(n: usize) -> Vec<Entry> {
        let mut entries: Vec<Entry> = (0..n)
            .map(|i| Entry {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: Some("shop".into()),
                name: format!("cm-{i:05}"),
                uid: format!("uid-{i}"),
                created_at: None,
                health: None,
                health_message: None,
                manifest: hex(&sha256(format!("m{i}").as_bytes())),
            })
            .collect();
        entries.sort_by(|a, b| a.key().cmp(&b.key()));
        entries
    }

    #[test]
    fn chunks_round_trip_and_one_change_touches_one_chunk() {
        let before = entries(1000);
        let stored = chunks(&before);
        assert!(
            (5..=60).contains(&stored.len()),
            "{} chunks for 1,000",
            stored.len()
        );
        let bodies: Vec<Vec<u8>> = stored.iter().map(|c| c.body.clone()).collect();
        assert_eq!(read_chunks(&bodies).unwrap(), before);

        let mut after = before.clone();
        after[500].manifest = hex(&sha256(b"changed"));
        let changed = chunks(&after);
        assert_eq!(changed.len(), stored.len());
        let differing = changed.iter().zip(&stored).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 1);

        // Inserting a resource shifts no cut either: every chunk but the one it joins is shared.
        let mut grown = before.clone();
        grown.push(Entry {
            name: "cm-00500a".into(),
            ..before[500].clone()
        });
        grown.sort_by(|a, b| a.key().cmp(&b.key()));
        let grown = chunks(&grown);
        let shared = grown.iter().filter(|c| stored.contains(c)).count();
        assert!(shared >= grown.len() - 2, "{shared} of {}", grown.len());
    }

    #[test]
    fn no_entries_no_chunks() {
        assert!(chunks(&[]).is_empty());
        assert_eq!(read_chunks(&[]).unwrap(), vec![]);
    }

    #[test]
    fn health_names_round_trip() {
        for h in [
            HealthStatus::Healthy,
            HealthStatus::Progressing,
            HealthStatus::Unknown,
        ] {
            assert_eq!(parse_health(h.as_str()), Some(h));
        }
        assert_eq!(parse_health("Fine"), None);
    }
}
