//! The text of a cached object, packed against another object of its kind.
//!
//! The watch cache keeps each object's text as the cluster sent it (for `manifest`, GitLab's
//! watch API, the history), and most of an object is most of its neighbour: Pods of one
//! ReplicaSet, Services of one chart, differ in names, uids, addresses and times. LZ4's block
//! format compresses against an outside dictionary, so each kind keeps one object's text as
//! its [`Dictionary`] and the others are stored as what differs from it: the benchmark's
//! objects go from 761 to under 100 bytes (BENCHMARKS.md). Reading a packed text back costs
//! a copy (some 150 ns for a 1 KB object); its readers are rare (a `manifest` asked for, an
//! object sent on GitLab's watch API, a snapshot), the graph and health read the tree.
//!
//! A text is packed in place ([`Text::pack`]), behind a lock of its own, so that every holder
//! of the object (a view's group, a subscription's last answer) gains at once, and the cache
//! can pack after it has answered: a list's objects are packed a moment after the list, off
//! the first view's path. A text is packed only when that is smaller, and only when it reads
//! back the same, so reading it back cannot fail.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard};

/// One object's text that others of its kind are packed against: at most [`Dictionary::MAX`]
/// bytes of its beginning.
#[derive(Debug, PartialEq, Eq)]
pub struct Dictionary(Box<[u8]>);

impl Dictionary {
    /// The most of an object's text a dictionary keeps: LZ4 looks back 64 KiB at most, and a
    /// kind's common part is its shape, not a large value.
    pub const MAX: usize = 16 << 10;

    pub fn of(text: &str) -> Arc<Dictionary> {
        let end = text.len().min(Self::MAX);
        Arc::new(Dictionary(text.as_bytes()[..end].into()))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An object's JSON text, as sent or packed.
pub struct Text(Mutex<Body>);

#[derive(Clone)]
enum Body {
    Plain(Box<str>),
    /// LZ4 against `dictionary`, the text's length in the first four bytes.
    Packed {
        dictionary: Arc<Dictionary>,
        bytes: Box<[u8]>,
    },
}

impl Text {
    pub fn plain(text: Box<str>) -> Text {
        Text(Mutex::new(Body::Plain(text)))
    }

    fn lock(&self) -> MutexGuard<'_, Body> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The text as it was given.
    pub fn get(&self) -> Cow<'static, str> {
        match &*self.lock() {
            Body::Plain(text) => Cow::Owned(text.to_string()),
            Body::Packed { dictionary, bytes } => Cow::Owned(unpack(bytes, dictionary)),
        }
    }

    /// Packs the text against `dictionary` if it is plain and comes out smaller.
    pub fn pack(&self, dictionary: &Arc<Dictionary>) {
        let mut body = self.lock();
        let Body::Plain(text) = &*body else { return };
        let bytes =
            lz4_flex::block::compress_prepend_size_with_dict(text.as_bytes(), &dictionary.0);
        // Kept only when it is smaller and reads back the same (as it always should): then
        // `get` cannot fail.
        if bytes.len() < text.len() && unpack(&bytes, dictionary) == **text {
            *body = Body::Packed {
                dictionary: dictionary.clone(),
                bytes: bytes.into_boxed_slice(),
            };
        }
    }

    /// The bytes the text takes on its own (its dictionary is the kind's, shared).
    pub fn bytes(&self) -> usize {
        match &*self.lock() {
            Body::Plain(text) => text.len(),
            Body::Packed { bytes, .. } => bytes.len(),
        }
    }

    /// Whether the two texts are the same: packed against the same dictionary, their packed
    /// bytes are (LZ4 is deterministic), else they are read back.
    pub fn same(&self, other: &Text) -> bool {
        if std::ptr::eq(self, other) {
            return true;
        }
        // Each read under its own lock, never both held: two comparisons of the same pair in
        // opposite orders would wait on each other.
        let a = self.lock().clone();
        let b = other.lock().clone();
        match (&a, &b) {
            (Body::Plain(a), Body::Plain(b)) => a == b,
            (
                Body::Packed {
                    dictionary: da,
                    bytes: a,
                },
                Body::Packed {
                    dictionary: db,
                    bytes: b,
                },
            ) if Arc::ptr_eq(da, db) => a == b,
            _ => self.get() == other.get(),
        }
    }
}

/// Packed bytes read back; empty if they do not read (never: [`Text::pack`] checks them).
fn unpack(bytes: &[u8], dictionary: &Dictionary) -> String {
    lz4_flex::block::decompress_size_prepended_with_dict(bytes, &dictionary.0)
        .ok()
        .and_then(|text| String::from_utf8(text).ok())
        .unwrap_or_default()
}

impl Clone for Text {
    fn clone(&self) -> Self {
        Text(Mutex::new(self.lock().clone()))
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Text").field(&self.get()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: &str) -> String {
        format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"shop","uid":"uid-{name}","labels":{{"app":"web"}}}},"spec":{{"containers":[{{"name":"web","image":"registry.example.com/shop/web:1.4.2"}}]}},"status":{{"phase":"Running","podIP":"{ip}"}}}}"#
        )
    }

    #[test]
    fn a_packed_text_reads_back_as_it_was_and_is_smaller() {
        let dictionary = Dictionary::of(&pod("web-1", "10.0.0.1"));
        let original = pod("web-2", "10.0.0.2");
        let text = Text::plain(original.clone().into());
        text.pack(&dictionary);
        assert_eq!(text.get(), original);
        assert!(
            text.bytes() < original.len() / 3,
            "{} of {}",
            text.bytes(),
            original.len()
        );
        // Packing again changes nothing.
        let packed = text.bytes();
        text.pack(&Dictionary::of("{}"));
        assert_eq!((text.bytes(), text.get()), (packed, original.into()));
    }

    #[test]
    fn a_text_that_would_not_shrink_stays_as_it_is() {
        let short = Text::plain("{}".into());
        short.pack(&Dictionary::of(&pod("web-1", "10.0.0.1")));
        assert_eq!((short.bytes(), short.get()), (2, "{}".into()));
        // Any bytes, escapes and text beyond the dictionary's reach included, read back.
        let odd: String = (0..40_000u32)
            .map(|i| char::from_u32(0x20 + (i * 7919) % 0x2000).unwrap_or('?'))
            .collect();
        let text = Text::plain(odd.clone().into());
        text.pack(&Dictionary::of(&odd[..odd.len() / 2]));
        assert_eq!(text.get(), odd);
    }

    #[test]
    fn sameness_of_texts_packed_or_not() {
        let one = Dictionary::of(&pod("web-1", "10.0.0.1"));
        let other = Dictionary::of(&pod("db-1", "10.0.9.9"));
        let text = |name: &str, dictionary: Option<&Arc<Dictionary>>| {
            let text = Text::plain(pod(name, "10.0.0.3").into());
            if let Some(d) = dictionary {
                text.pack(d);
            }
            text
        };
        for (a, b) in [
            (Some(&one), Some(&one)),
            (Some(&one), Some(&other)),
            (Some(&one), None),
            (None, None),
        ] {
            assert!(text("web-3", a).same(&text("web-3", b)));
            assert!(!text("web-3", a).same(&text("web-4", b)));
        }
        // The dictionary is kept to its first 16 KiB.
        assert_eq!(Dictionary::of(&"x".repeat(20_000)).len(), Dictionary::MAX);
    }
}
