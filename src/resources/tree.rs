//! A compact JSON tree: what the health rules and the dependency graph read objects through.
//!
//! `serde_json::Value` keeps every map key and every string in an allocation of its own, and
//! its maps in B-tree nodes. Reading one field of an object not in cache (a large resource
//! group is never in cache) then costs a cache miss per key compared on the way. Here a map is
//! one slice of entries, a string of up to 24 bytes (nearly every name of a Kubernetes object)
//! sits inline in its entry, and a key is a pointer to one of the names Kubernetes' types use
//! ([`super::keys`]; 8 bytes of the entry's 32), so that finding `metadata.uid` reads a few
//! contiguous lines and a small table that stays in cache. Entries keep the order of the text; a key given twice keeps its last value,
//! as `serde_json` does.
//!
//! [`Keep`] parses only chosen fields, in the same pass, skipping the rest unbuilt.

use std::borrow::{Borrow, Cow};
use std::cell::RefCell;

use compact_str::CompactString;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::keys::Key;

/// A JSON value.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Tree {
    #[default]
    Null,
    Bool(bool),
    /// Integers, as `serde_json` reads them; `UInt` only above `i64::MAX`.
    Int(i64),
    UInt(u64),
    Float(f64),
    String(CompactString),
    Array(Box<[Tree]>),
    Object(Map),
}

/// A JSON object: its entries in the order of the text.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Map(Box<[(Key, Tree)]>);

/// The bytes of one entry of a [`Map`]: its key and its value.
pub const ENTRY_BYTES: usize = std::mem::size_of::<(Key, Tree)>();

impl Map {
    /// The value of `key`. Lengths are compared before text; an interned key's text is in a
    /// table small enough to stay in cache ([`super::keys`]).
    pub fn get(&self, key: &str) -> Option<&Tree> {
        self.0
            .iter()
            .find_map(|(k, v)| (k.len() == key.len() && k.as_str() == key).then_some(v))
    }

    /// Sets `key`: in its place when it is there, else last.
    pub fn set(&mut self, key: &str, value: Tree) {
        self.set_all([(key, value)]);
    }

    /// Sets each of `fields` as [`Self::set`] does, growing the map at most once: a list
    /// item's type is set on every object listed.
    pub fn set_all<'k>(&mut self, fields: impl IntoIterator<Item = (&'k str, Tree)>) {
        let fields = fields.into_iter();
        let more = fields.size_hint().1.unwrap_or(1);
        let mut grown: Option<Vec<Entry>> = None;
        for (key, value) in fields {
            let entries = grown.as_deref_mut().unwrap_or(&mut self.0);
            if let Some(entry) = entries.iter_mut().find(|(k, _)| k.as_str() == key) {
                entry.1 = value;
                continue;
            }
            grown
                .get_or_insert_with(|| {
                    let mut entries = Vec::with_capacity(self.0.len() + more);
                    entries.extend(std::mem::take(&mut self.0).into_vec());
                    entries
                })
                .push((Key::new(key), value));
        }
        if let Some(entries) = grown {
            self.0 = entries.into_boxed_slice();
        }
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn iter(&self) -> <&Map as IntoIterator>::IntoIter {
        self.into_iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

type Entry = (Key, Tree);

impl<'a> IntoIterator for &'a Map {
    type Item = (&'a str, &'a Tree);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, Entry>, fn(&'a Entry) -> Self::Item>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }
}

impl<'a> FromIterator<(&'a str, Tree)> for Map {
    /// A repeated key keeps its last value, in the place of its first.
    fn from_iter<I: IntoIterator<Item = (&'a str, Tree)>>(entries: I) -> Self {
        let mut map: Vec<Entry> = Vec::new();
        for (key, value) in entries {
            match map.iter_mut().find(|(k, _)| k.as_str() == key) {
                Some(entry) => entry.1 = value,
                None => map.push((Key::new(key), value)),
            }
        }
        Map(map.into_boxed_slice())
    }
}

impl Tree {
    /// `self[key]` of an object; `None` for a missing key or anything but an object.
    pub fn get(&self, key: &str) -> Option<&Tree> {
        self.as_object()?.get(key)
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Tree::String(s) => Some(s),
            _ => None,
        }
    }

    /// An integer that fits in `i64`, as `serde_json::Value::as_i64` reads it.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Tree::Int(i) => Some(i),
            Tree::UInt(u) => i64::try_from(u).ok(),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Tree::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Tree]> {
        match self {
            Tree::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Map> {
        match self {
            Tree::Object(map) => Some(map),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Tree::Null)
    }

    pub fn is_object(&self) -> bool {
        matches!(self, Tree::Object(_))
    }

    pub fn is_string(&self) -> bool {
        matches!(self, Tree::String(_))
    }

    /// Starts loading the maps and arrays `depth` levels below this value into the cache,
    /// without waiting for them; the levels above must be in cache already, or this waits.
    pub fn prefetch(&self, depth: u32) {
        match self {
            Tree::Array(items) if depth == 0 => prefetch(items),
            Tree::Array(items) => items.iter().for_each(|item| item.prefetch(depth - 1)),
            Tree::Object(map) if depth == 0 => prefetch(&map.0),
            Tree::Object(map) => map.0.iter().for_each(|(_, v)| v.prefetch(depth - 1)),
            _ => {}
        }
    }
}

/// Prefetches the first lines of `items`: eight lines hold the entries of nearly every map of
/// a Kubernetes object.
fn prefetch<T>(items: &[T]) {
    let bytes = std::mem::size_of_val(items);
    let start = items.as_ptr().cast::<i8>();
    for offset in (0..bytes).step_by(64).take(8) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch reads nothing; the address is inside `items`.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(start.add(offset));
        }
    }
}

/// How far ahead of the object being read each level of the trees is prefetched: a level can
/// only be prefetched once the level above it has arrived.
const AHEAD: [usize; 4] = [8, 6, 4, 2];

/// The trees of `objects` in order, each prefetched ([`Tree::prefetch`]) a few objects ahead of
/// its reading when `prefetch`: a pass over a group too large for the caches otherwise waits
/// for memory at each map it enters, one map after the other. Measured over a generated
/// environment (`benches/resources.rs`), one thread reading the trees with their health: 40%
/// less time at 100,000 objects, and a third more at 1,000, which are in cache anyway; see
/// [`super::PREFETCH_FROM`].
pub fn prefetched<T: Borrow<Tree>>(
    objects: &[T],
    prefetch: bool,
) -> impl Iterator<Item = &Tree> + '_ {
    objects.iter().enumerate().map(move |(i, object)| {
        if prefetch {
            for (depth, ahead) in AHEAD.into_iter().enumerate() {
                if let Some(next) = objects.get(i + ahead) {
                    next.borrow().prefetch(depth as u32);
                }
            }
        }
        object.borrow()
    })
}

impl From<&serde_json::Value> for Tree {
    fn from(value: &serde_json::Value) -> Self {
        use serde_json::Value;
        match value {
            Value::Null => Tree::Null,
            Value::Bool(b) => Tree::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Tree::Int(i),
                (None, Some(u)) => Tree::UInt(u),
                _ => Tree::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => Tree::String(s.into()),
            Value::Array(items) => Tree::Array(items.iter().map(Tree::from).collect()),
            Value::Object(map) => Tree::Object(
                map.iter()
                    .map(|(k, v)| (k.as_str(), Tree::from(v)))
                    .collect(),
            ),
        }
    }
}

impl From<&Tree> for serde_json::Value {
    fn from(tree: &Tree) -> Self {
        use serde_json::Value;
        match tree {
            Tree::Null => Value::Null,
            Tree::Bool(b) => Value::Bool(*b),
            Tree::Int(i) => Value::from(*i),
            Tree::UInt(u) => Value::from(*u),
            Tree::Float(f) => Value::from(*f),
            Tree::String(s) => Value::String(s.to_string()),
            Tree::Array(items) => Value::Array(items.iter().map(Value::from).collect()),
            Tree::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.to_owned(), Value::from(v)))
                    .collect(),
            ),
        }
    }
}

thread_local! {
    /// The entries of the maps being parsed on this thread, innermost last ([`Entries`]).
    static ENTRIES: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    /// The items of the arrays being parsed on this thread, innermost last ([`Items`]).
    static ITEMS: RefCell<Vec<Tree>> = const { RefCell::new(Vec::new()) };
}

/// The entries of one map being parsed, gathered on the thread's stack of entries ([`ENTRIES`])
/// above those of the maps it is inside, then moved into a slice of exactly their number: one
/// allocation per map. A `Vec` per map grew by doubling (a map of 9 entries was allocated at
/// 4, 8 and 16 entries, then shrunk), and a shrunk block stays as large in the allocator.
/// Dropped unfinished (a parse error), it takes its entries off the stack.
pub(crate) struct Entries {
    start: usize,
}

impl Entries {
    pub(crate) fn start() -> Entries {
        Entries {
            start: ENTRIES.with_borrow(Vec::len),
        }
    }

    /// Adds `key`; a repeated key keeps its last value, in the place of its first, as
    /// `serde_json` does. An interned key is found again by its pointer alone.
    pub(crate) fn push(&mut self, key: &str, value: Tree) {
        let key = Key::new(key);
        ENTRIES.with_borrow_mut(|entries| {
            match entries[self.start..].iter_mut().find(|(k, _)| k.same(&key)) {
                Some(entry) => entry.1 = value,
                None => entries.push((key, value)),
            }
        });
    }

    pub(crate) fn finish(self) -> Map {
        let map = ENTRIES.with_borrow_mut(|entries| Map(entries.drain(self.start..).collect()));
        std::mem::forget(self);
        map
    }
}

impl Drop for Entries {
    fn drop(&mut self) {
        // Unfinished: the parse failed (or panicked) inside this map.
        ENTRIES.with_borrow_mut(|entries| entries.truncate(self.start));
    }
}

/// The items of one array being parsed, as [`Entries`] gathers a map's.
struct Items {
    start: usize,
}

impl Items {
    fn start() -> Items {
        Items {
            start: ITEMS.with_borrow(Vec::len),
        }
    }

    fn push(&mut self, item: Tree) {
        ITEMS.with_borrow_mut(|items| items.push(item));
    }

    fn finish(self) -> Box<[Tree]> {
        let items = ITEMS.with_borrow_mut(|items| items.drain(self.start..).collect());
        std::mem::forget(self);
        items
    }
}

impl Drop for Items {
    fn drop(&mut self) {
        ITEMS.with_borrow_mut(|items| items.truncate(self.start));
    }
}

/// Which part of a JSON value to build: all of it, or the named fields of an object, each with
/// its own rule. On an array the rule applies to every element; a scalar is kept as it is.
#[derive(Debug, Clone, Copy)]
pub enum Keep {
    All,
    Fields(&'static [(&'static str, Keep)]),
}

impl Keep {
    /// The `self` part of the JSON text `text`, in one pass that builds nothing else.
    pub fn parse(self, text: &str) -> serde_json::Result<Tree> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let tree = self.deserialize(&mut deserializer)?;
        deserializer.end()?;
        Ok(tree)
    }
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Tree, D::Error> {
        Keep::All.deserialize(deserializer)
    }
}

impl<'de> DeserializeSeed<'de> for Keep {
    type Value = Tree;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Tree, D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// A map key as the text has it: borrowed, unless escapes had to be undone. A `Cow<str>` would
/// not do: serde reads a `Cow` through its owned form, a `String` for every key of every object,
/// skipped ones included, and those allocations were a tenth of a list's parse.
pub(crate) struct TextKey<'de>(pub(crate) Cow<'de, str>);

impl<'de> Deserialize<'de> for TextKey<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TextKey<'de>, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = TextKey<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a map key")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<TextKey<'de>, E> {
        Ok(TextKey(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<TextKey<'de>, E> {
        Ok(TextKey(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<TextKey<'de>, E> {
        Ok(TextKey(Cow::Owned(v)))
    }
}

impl<'de> Visitor<'de> for Keep {
    type Value = Tree;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut entries = Entries::start();
        while let Some(TextKey(key)) = map.next_key()? {
            let keep = match self {
                Keep::All => Some(Keep::All),
                Keep::Fields(fields) => fields.iter().find(|(name, _)| *name == key).map(|f| f.1),
            };
            let Some(keep) = keep else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let value = map.next_value_seed(keep)?;
            entries.push(&key, value);
        }
        Ok(Tree::Object(entries.finish()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Items::start();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Tree::Array(items.finish()))
    }

    fn visit_bool<E>(self, v: bool) -> Result<Tree, E> {
        Ok(Tree::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Tree, E> {
        Ok(Tree::Int(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Tree, E> {
        Ok(i64::try_from(v).map_or(Tree::UInt(v), Tree::Int))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Tree, E> {
        Ok(Tree::Float(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::String(v.into()))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Tree, E> {
        Ok(Tree::String(v.into()))
    }

    fn visit_string<E>(self, v: String) -> Result<Tree, E> {
        Ok(Tree::String(v.into()))
    }

    fn visit_unit<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }

    fn visit_none<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Tree, D::Error> {
        self.deserialize(deserializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_as_serde_json_reads() {
        let value = json!({"a": [1, -2, 3.5, 18446744073709551615u64, true, null, "x"],
                           "b": {"c": "a string longer than twenty-four bytes", "d": {}}, "": ""});
        let tree: Tree = serde_json::from_str(&value.to_string()).unwrap();
        assert_eq!(tree, Tree::from(&value));
        assert_eq!(serde_json::Value::from(&tree), value);
        let a = tree.get("a").and_then(Tree::as_array).unwrap();
        let as_i64: Vec<_> = a.iter().map(Tree::as_i64).collect();
        let expected: Vec<_> = value["a"]
            .as_array()
            .unwrap()
            .iter()
            .map(serde_json::Value::as_i64)
            .collect();
        assert_eq!(as_i64, expected);
        assert_eq!(a[4].as_bool(), Some(true));
        assert!(a[5].is_null() && !a[6].is_null() && a[6].is_string());
        let b = tree.get("b").unwrap();
        assert_eq!(
            b.get("c").and_then(Tree::as_str),
            Some("a string longer than twenty-four bytes")
        );
        assert!(
            b.get("d").unwrap().is_object() && b.get("d").unwrap().as_object().unwrap().is_empty()
        );
        assert_eq!(tree.get(""), Some(&Tree::String("".into())));
        assert_eq!(tree.get("nope"), None);
        assert_eq!(Tree::Int(1).get("a"), None);
    }

    #[test]
    fn keys_with_escapes_read_as_serde_json_reads_them() {
        let text = r#"{"a\"b": 1, "k\u00e9y": {"x\ny": [{"\\": 2}]}, "plain": 3}"#;
        let tree: Tree = serde_json::from_str(text).unwrap();
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::Value::from(&tree), value);
        let inner = tree.get("kéy").and_then(|k| k.get("x\ny"));
        assert!(inner
            .and_then(Tree::as_array)
            .is_some_and(|a| a[0].get("\\").is_some()));
        assert_eq!(tree.get("a\"b").and_then(Tree::as_i64), Some(1));
        let kept = Keep::Fields(&[("kéy", Keep::All)]).parse(text).unwrap();
        assert_eq!(
            serde_json::Value::from(&kept),
            serde_json::json!({"kéy": value["kéy"]})
        );
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value_as_serde_json_does() {
        let text = r#"{"a": 1, "b": 2, "a": 3}"#;
        let tree: Tree = serde_json::from_str(text).unwrap();
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(tree.get("a"), Some(&Tree::Int(3)));
        assert_eq!(tree.as_object().unwrap().len(), 2);
        assert_eq!(serde_json::Value::from(&tree), value);
    }

    #[test]
    fn a_failed_parse_leaves_nothing_behind_for_the_next() {
        // Errors deep inside maps and arrays, of both readers; each stack is back as it was.
        let depth = || (ENTRIES.with_borrow(Vec::len), ITEMS.with_borrow(Vec::len));
        let before = depth();
        for bad in [
            r#"{"a": {"b": [1, {"c": "x", "d": ]}]}}"#,
            r#"{"a": 1, "b": [[2, 3], {"e": tru}]"#,
            r#"[{"a": 1}, {"b": 2"#,
        ] {
            assert!(serde_json::from_str::<Tree>(bad).is_err(), "{bad}");
            assert!(Keep::Fields(&[("a", Keep::All), ("b", Keep::All)])
                .parse(bad)
                .is_err());
            assert_eq!(depth(), before, "{bad}");
        }
        let good = json!({"a": {"b": [1, {"c": "x"}]}, "z": [[], {}]});
        let tree: Tree = serde_json::from_str(&good.to_string()).unwrap();
        assert_eq!(serde_json::Value::from(&tree), good);
    }

    #[test]
    fn keep_builds_only_the_named_fields() {
        const KEEP: Keep =
            Keep::Fields(&[("a", Keep::All), ("b", Keep::Fields(&[("c", Keep::All)]))]);
        let text = r#"{"a": {"x": [1]}, "b": [{"c": 1, "d": 2}, 3, {"d": {"e": []}}], "z": {"deep": [[[]]]}}"#;
        assert_eq!(
            serde_json::Value::from(&KEEP.parse(text).unwrap()),
            json!({"a": {"x": [1]}, "b": [{"c": 1}, 3, {}]})
        );
        assert!(KEEP.parse(r#"{"a": "#).is_err());
        assert!(KEEP.parse("{} {}").is_err());
        assert_eq!(
            KEEP.parse("[1, null]").unwrap(),
            Tree::Array([Tree::Int(1), Tree::Null].into())
        );
    }

    #[test]
    fn prefetched_trees_come_in_order_whatever_their_shape() {
        // Every shape at every depth the prefetch reaches, and lists shorter and longer than
        // how far ahead it looks.
        let shapes = [
            json!({"a": {"b": [{"c": {"d": [1, "x"]}}, null]}, "e": "a string longer than inline"}),
            json!([[[[[]]]], {}, 2.5, true]),
            json!("text"),
            json!(null),
            json!({}),
        ];
        for n in [0, 1, 3, 9, 40] {
            let trees: Vec<Tree> = (0..n)
                .map(|i| Tree::from(&shapes[i % shapes.len()]))
                .collect();
            for prefetch in [false, true] {
                let read: Vec<&Tree> = prefetched(&trees, prefetch).collect();
                assert_eq!(read, trees.iter().collect::<Vec<_>>());
            }
        }
    }
}
