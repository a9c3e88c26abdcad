//! A compact JSON tree: what the health rules and the dependency graph read objects through.
//!
//! `serde_json::Value` keeps every map key and every string in an allocation of its own, and
//! its maps in B-tree nodes. Here a whole value is one run of bytes, one allocation per object
//! ([`TreeBuf`]): each value a tag byte and what it holds, a string inline with its length, a
//! map or an array with the length of its contents so that a reader steps over it without
//! entering it, and a map key as a byte or two, the place of its name among the names
//! Kubernetes' types use ([`super::keys`]), or its text inline when it is not one of them. A
//! tree of boxed slices per map and per array took 667 B and 8 allocations for what is here
//! about 200 B and one (BENCHMARKS.md, sessions 21 and 24), and reading one field walks a
//! few contiguous lines instead of a pointer per level.
//!
//! A [`Tree`] is a view of the bytes of one value (`&Tree` borrows them from the object's
//! buffer); finding a key scans the map's entries, stepping over each value by its length.
//! Entries keep the order of the text; a key given twice keeps its last value in the place of
//! its first, as `serde_json` does.
//!
//! [`Keep`] parses only chosen fields, in the same pass, skipping the rest unbuilt; the parse
//! writes the bytes on a per-thread scratch buffer and copies them once into their allocation.
//!
//! The encoding (integers little-endian; a length is a `u32` unless said otherwise). Every
//! value has one encoding, the smallest, so that equal values are equal bytes:
//! - `NULL`, `FALSE`, `TRUE`: the tag alone;
//! - `TINY_INT` and an `i8`; `SMALL_INT` and an `i32`; `INT` and an `i64`; `UINT` and a `u64`
//!   (only above `i64::MAX`); `FLOAT` and an `f64`: an integer in the smallest that holds it;
//! - a string of fewer than [`SHORT_STRINGS`] bytes: `SHORT_STRING + length` and its bytes;
//!   longer, `LONG_STRING`, its length and its bytes;
//! - an array or an object: its tag, the length of its contents, then its items, or its
//!   entries: a key (below) and a value each. The tag tells how the length is written:
//!   `ARRAY8` and `OBJECT8` a `u8`, `ARRAY16` and `OBJECT16` a `u16`, `ARRAY` and `OBJECT` a
//!   `u32` (most of an object's maps hold a few short entries: with a `u32` length each, two
//!   bytes a key and five an integer, a tree was a fifth larger, BENCHMARKS.md, session 24);
//! - a key: below `0x80`, the place of a name of [`super::keys::NAMES`] in one byte (the
//!   table's first names are the most used); `0x80` to `0xBF`, a place in two bytes (six bits
//!   of the first, big-endian); `INLINE_KEY + length` (below `LONG_KEY`) and the bytes of a
//!   shorter key; `LONG_KEY`, a `u32` length and the bytes.

use std::borrow::{Borrow, Cow};
use std::cell::RefCell;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::keys;

const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const SMALL_INT: u8 = 3;
const INT: u8 = 4;
const UINT: u8 = 5;
const FLOAT: u8 = 6;
const LONG_STRING: u8 = 7;
const ARRAY: u8 = 8;
const OBJECT: u8 = 9;
const ARRAY8: u8 = 10;
const OBJECT8: u8 = 11;
const ARRAY16: u8 = 12;
const OBJECT16: u8 = 13;
const TINY_INT: u8 = 14;
const SHORT_STRING: u8 = 16;
/// Strings shorter than this are written with their length in their tag.
pub const SHORT_STRINGS: usize = (u8::MAX - SHORT_STRING) as usize + 1;

/// A key's first byte: below this, the place of a name in one byte.
const NAMED_SHORT: u8 = 0x80;
/// From [`NAMED_SHORT`] to below this, the place of a name in two bytes.
const NAMED_LONG: u8 = 0xC0;
const INLINE_KEY: u8 = 0xC0;
const LONG_KEY: u8 = u8::MAX;
const _: () = assert!(keys::NAMES.len() <= 0x4000);

/// The bytes of a container's tag and `u32` length, before its contents (and of a long
/// string's); a container being written has this head until it is finished.
const HEAD: usize = 5;

/// One JSON value: a view of its bytes (see the module's documentation). Made only by this
/// module's writers, so its bytes are always a whole value as they write it.
#[repr(transparent)]
#[derive(PartialEq, Eq)]
pub struct Tree([u8]);

/// The entries of a JSON object, in the order of the text.
#[repr(transparent)]
#[derive(PartialEq, Eq)]
pub struct Map([u8]);

/// A tree that owns its bytes: one allocation of exactly their size.
#[derive(Clone, PartialEq, Eq)]
pub struct TreeBuf(Box<[u8]>);

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The bytes of the value that starts `b`.
#[inline(always)]
fn value_len(b: &[u8]) -> usize {
    match b[0] {
        NULL | FALSE | TRUE => 1,
        TINY_INT => 2,
        SMALL_INT => 5,
        INT | UINT | FLOAT => 9,
        ARRAY8 | OBJECT8 => 2 + usize::from(b[1]),
        ARRAY16 | OBJECT16 => 3 + usize::from(u16::from_le_bytes([b[1], b[2]])),
        LONG_STRING | ARRAY | OBJECT => HEAD + u32_at(b, 1),
        tag => 1 + usize::from(tag - SHORT_STRING),
    }
}

/// The bytes of the head of the container whose tag is `tag`, if it is an array (`Some(false)`
/// with the head) or an object (`Some(true)`).
#[inline(always)]
fn container(tag: u8) -> Option<(bool, usize)> {
    match tag {
        ARRAY8 => Some((false, 2)),
        ARRAY16 => Some((false, 3)),
        ARRAY => Some((false, HEAD)),
        OBJECT8 => Some((true, 2)),
        OBJECT16 => Some((true, 3)),
        OBJECT => Some((true, HEAD)),
        _ => None,
    }
}

/// Finishes the container written on `b` from `at` with a [`HEAD`] of room: its length in the
/// smallest head that holds it, the contents moved up to it.
fn close(b: &mut Vec<u8>, at: usize) -> Result<(), TooLarge> {
    let len = b.len() - at - HEAD;
    let object = b[at] == OBJECT;
    if let Ok(small) = u8::try_from(len) {
        b[at] = if object { OBJECT8 } else { ARRAY8 };
        b[at + 1] = small;
        b.drain(at + 2..at + HEAD);
    } else if let Ok(middle) = u16::try_from(len) {
        b[at] = if object { OBJECT16 } else { ARRAY16 };
        b[at + 1..at + 3].copy_from_slice(&middle.to_le_bytes());
        b.drain(at + 3..at + HEAD);
    } else {
        let len = u32::try_from(len).map_err(|_| TooLarge)?;
        b[at + 1..at + HEAD].copy_from_slice(&len.to_le_bytes());
    }
    Ok(())
}

/// A key as written: the place of an interned name, or the bytes of any other.
enum KeyCode<'a> {
    Named(u16),
    Text(&'a [u8]),
}

/// The key that starts `b`, and the bytes it takes.
#[inline(always)]
fn key_at(b: &[u8]) -> (KeyCode<'_>, usize) {
    let first = b[0];
    if first < NAMED_SHORT {
        (KeyCode::Named(u16::from(first)), 1)
    } else if first < NAMED_LONG {
        (
            KeyCode::Named(u16::from_be_bytes([first - NAMED_SHORT, b[1]])),
            2,
        )
    } else if first < LONG_KEY {
        let len = usize::from(first - INLINE_KEY);
        (KeyCode::Text(&b[1..1 + len]), 1 + len)
    } else {
        let len = u32_at(b, 1);
        (KeyCode::Text(&b[5..5 + len]), 5 + len)
    }
}

/// Text this module wrote from a `&str`.
fn text(b: &[u8]) -> &str {
    // SAFETY: every string and key in a tree's bytes was copied from a `&str` by this
    // module's writers, and trees are made from no other bytes (`Tree::of` is private).
    unsafe { std::str::from_utf8_unchecked(b) }
}

impl Tree {
    /// The value whose bytes are `b`: bytes written by this module only.
    fn of(b: &[u8]) -> &Tree {
        // SAFETY: `Tree` is a transparent wrapper of `[u8]`.
        unsafe { &*(std::ptr::from_ref::<[u8]>(b) as *const Tree) }
    }

    /// `self[key]` of an object; `None` for a missing key or anything but an object.
    pub fn get(&self, key: &str) -> Option<&Tree> {
        self.as_object()?.get(key)
    }

    pub fn as_str(&self) -> Option<&str> {
        match self.0[0] {
            LONG_STRING => Some(text(&self.0[HEAD..])),
            tag if tag >= SHORT_STRING => Some(text(&self.0[1..])),
            _ => None,
        }
    }

    /// An integer that fits in `i64`, as `serde_json::Value::as_i64` reads it.
    pub fn as_i64(&self) -> Option<i64> {
        match self.0[0] {
            TINY_INT => Some(i64::from(self.0[1] as i8)),
            SMALL_INT => Some(i64::from(i32::from_le_bytes([
                self.0[1], self.0[2], self.0[3], self.0[4],
            ]))),
            INT => Some(u64_at(&self.0, 1) as i64),
            // Written only above `i64::MAX`.
            _ => None,
        }
    }

    /// A number as `serde_json::Value::as_f64` reads it.
    pub fn as_f64(&self) -> Option<f64> {
        match self.0[0] {
            FLOAT => Some(f64::from_bits(u64_at(&self.0, 1))),
            UINT => Some(u64_at(&self.0, 1) as f64),
            _ => self.as_i64().map(|i| i as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self.0[0] {
            FALSE => Some(false),
            TRUE => Some(true),
            _ => None,
        }
    }

    /// The items of an array, in order.
    pub fn as_array(&self) -> Option<Items<'_>> {
        match container(self.0[0]) {
            Some((false, head)) => Some(Items(&self.0[head..])),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Map> {
        match container(self.0[0]) {
            Some((true, head)) => Some(Map::of(&self.0[head..])),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        self.0[0] == NULL
    }

    pub fn is_object(&self) -> bool {
        matches!(container(self.0[0]), Some((true, _)))
    }

    pub fn is_array(&self) -> bool {
        matches!(container(self.0[0]), Some((false, _)))
    }

    pub fn is_string(&self) -> bool {
        self.0[0] >= SHORT_STRING || self.0[0] == LONG_STRING
    }

    /// The bytes this value takes.
    pub fn bytes(&self) -> usize {
        self.0.len()
    }

    /// Starts loading the first lines of this value into the cache, without waiting for them:
    /// eight lines hold nearly every object's kept fields whole.
    pub fn prefetch(&self) {
        let start = self.0.as_ptr().cast::<i8>();
        for offset in (0..self.0.len()).step_by(64).take(8) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch reads nothing; the address is inside the value's bytes.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(start.add(offset));
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (start, offset);
        }
    }
}

impl ToOwned for Tree {
    type Owned = TreeBuf;

    fn to_owned(&self) -> TreeBuf {
        TreeBuf(self.0.into())
    }
}

impl std::fmt::Debug for Tree {
    /// As its JSON text.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", serde_json::Value::from(self))
    }
}

impl Map {
    fn of(b: &[u8]) -> &Map {
        // SAFETY: `Map` is a transparent wrapper of `[u8]`.
        unsafe { &*(std::ptr::from_ref::<[u8]>(b) as *const Map) }
    }

    /// The value of `key`: each entry's key compared by its length, then its text (an
    /// interned name's in [`keys::NAMES`], a table small enough to stay in cache), each
    /// entry's value stepped over by its length. Finding the key's place by its hash first
    /// cost more than the comparisons a map of a few entries takes.
    pub fn get(&self, key: &str) -> Option<&Tree> {
        let key = key.as_bytes();
        let mut rest = &self.0;
        while !rest.is_empty() {
            let (code, at) = key_at(rest);
            let same = match code {
                KeyCode::Named(i) => keys::NAMES[usize::from(i)].as_bytes() == key,
                KeyCode::Text(t) => t == key,
            };
            let len = value_len(&rest[at..]);
            if same {
                return Some(Tree::of(&rest[at..at + len]));
            }
            rest = &rest[at + len..];
        }
        None
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn iter(&self) -> Entries<'_> {
        Entries(&self.0)
    }

    /// The number of entries (counted: a map's contents are not indexed).
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Map {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// The entries of a [`Map`], in order.
#[derive(Clone, Default)]
pub struct Entries<'a>(&'a [u8]);

impl<'a> Iterator for Entries<'a> {
    type Item = (&'a str, &'a Tree);

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let (code, at) = key_at(self.0);
        let key = match code {
            KeyCode::Named(i) => keys::NAMES[usize::from(i)],
            KeyCode::Text(t) => text(t),
        };
        let len = value_len(&self.0[at..]);
        let value = Tree::of(&self.0[at..at + len]);
        self.0 = &self.0[at + len..];
        Some((key, value))
    }
}

impl<'a> IntoIterator for &'a Map {
    type Item = (&'a str, &'a Tree);
    type IntoIter = Entries<'a>;

    fn into_iter(self) -> Entries<'a> {
        self.iter()
    }
}

/// The items of an array, in order.
#[derive(Clone, Default)]
pub struct Items<'a>(&'a [u8]);

impl<'a> Items<'a> {
    /// The number of items (counted: an array's contents are not indexed).
    pub fn len(&self) -> usize {
        self.clone().count()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The items again, from the first: as `<[Tree]>::iter` read them.
    pub fn iter(&self) -> Items<'a> {
        self.clone()
    }

    /// The item at `index`.
    pub fn get(&self, index: usize) -> Option<&'a Tree> {
        self.clone().nth(index)
    }

    pub fn first(&self) -> Option<&'a Tree> {
        self.clone().next()
    }
}

impl<'a> Iterator for Items<'a> {
    type Item = &'a Tree;

    fn next(&mut self) -> Option<&'a Tree> {
        if self.0.is_empty() {
            return None;
        }
        let len = value_len(self.0);
        let (item, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(Tree::of(item))
    }
}

impl std::fmt::Debug for Items<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.clone()).finish()
    }
}

impl std::ops::Deref for TreeBuf {
    type Target = Tree;

    fn deref(&self) -> &Tree {
        Tree::of(&self.0)
    }
}

impl Borrow<Tree> for TreeBuf {
    fn borrow(&self) -> &Tree {
        self
    }
}

impl AsRef<Tree> for TreeBuf {
    fn as_ref(&self) -> &Tree {
        self
    }
}

impl Default for TreeBuf {
    /// `null`.
    fn default() -> TreeBuf {
        TreeBuf(Box::new([NULL]))
    }
}

impl std::fmt::Debug for TreeBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl PartialEq<Tree> for TreeBuf {
    fn eq(&self, other: &Tree) -> bool {
        **self == *other
    }
}

impl TreeBuf {
    /// A string.
    pub fn string(s: &str) -> TreeBuf {
        capture(|| with(|b| put_string(b, s))).unwrap_or_default()
    }

    /// Sets each of `fields` of an object to a string: in its place when it is there, else
    /// after the entries, in one new allocation; anything but an object is left as it is. A
    /// list item's type is set so on every object listed. Fields after the 64th are not set.
    pub fn set_strings(&mut self, fields: &[(&str, &str)]) {
        let Some(map) = self.as_object() else {
            return;
        };
        let fields = &fields[..fields.len().min(64)];
        let mut done = 0u64;
        let mut out = Vec::with_capacity(
            self.0.len()
                + fields
                    .iter()
                    .map(|(k, v)| 11 + k.len() + v.len())
                    .sum::<usize>(),
        );
        out.extend_from_slice(&[OBJECT, 0, 0, 0, 0]);
        let mut rest = &map.0;
        while !rest.is_empty() {
            let (code, at) = key_at(rest);
            let len = value_len(&rest[at..]);
            let key = match code {
                KeyCode::Named(i) => keys::NAMES[usize::from(i)],
                KeyCode::Text(t) => text(t),
            };
            out.extend_from_slice(&rest[..at]);
            match fields.iter().position(|(k, _)| *k == key) {
                Some(i) => {
                    done |= 1 << i;
                    if put_string(&mut out, fields[i].1).is_err() {
                        return;
                    }
                }
                None => out.extend_from_slice(&rest[at..at + len]),
            }
            rest = &rest[at + len..];
        }
        let left = fields
            .iter()
            .enumerate()
            .filter(|(i, _)| done & (1 << i) == 0);
        for (_, (key, value)) in left {
            put_key(&mut out, key);
            if put_string(&mut out, value).is_err() {
                return;
            }
        }
        if close(&mut out, 0).is_err() {
            return;
        }
        self.0 = out.into_boxed_slice();
    }
}

impl From<&serde_json::Value> for TreeBuf {
    /// A value over 4 GiB (none that this service reads: every body it parses is bounded)
    /// comes out `null`.
    fn from(value: &serde_json::Value) -> TreeBuf {
        capture(|| write_value(value)).unwrap_or_default()
    }
}

/// Writes `value` on the scratch buffer.
fn write_value(value: &serde_json::Value) -> Result<(), TooLarge> {
    use serde_json::Value;
    match value {
        Value::Null => with(|b| b.push(NULL)),
        Value::Bool(v) => with(|b| b.push(if *v { TRUE } else { FALSE })),
        Value::Number(n) => with(|b| match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => put_int(b, i),
            (None, Some(u)) => put_uint(b, u),
            _ => put_float(b, n.as_f64().unwrap_or(f64::NAN)),
        }),
        Value::String(s) => with(|b| put_string(b, s))?,
        Value::Array(items) => {
            let array = Container::start(ARRAY);
            for item in items {
                write_value(item)?;
            }
            array.finish()?;
        }
        Value::Object(map) => {
            let mut object = Container::start(OBJECT);
            for (key, value) in map {
                let entry = object.key(key);
                write_value(value)?;
                object.end_entry(entry);
            }
            object.finish()?;
        }
    }
    Ok(())
}

impl From<&Tree> for serde_json::Value {
    fn from(tree: &Tree) -> Self {
        use serde_json::Value;
        match tree.0[0] {
            NULL => Value::Null,
            FALSE => Value::Bool(false),
            TRUE => Value::Bool(true),
            TINY_INT | SMALL_INT | INT => Value::from(tree.as_i64().unwrap_or_default()),
            UINT => Value::from(u64_at(&tree.0, 1)),
            FLOAT => Value::from(tree.as_f64().unwrap_or_default()),
            ARRAY8 | ARRAY16 | ARRAY => Value::Array(
                tree.as_array()
                    .unwrap_or_default()
                    .map(Value::from)
                    .collect(),
            ),
            OBJECT8 | OBJECT16 | OBJECT => Value::Object(
                tree.as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.to_owned(), Value::from(v)))
                    .collect(),
            ),
            _ => Value::String(tree.as_str().unwrap_or_default().to_owned()),
        }
    }
}

impl From<&TreeBuf> for serde_json::Value {
    fn from(tree: &TreeBuf) -> Self {
        serde_json::Value::from(&**tree)
    }
}

/// A value too large for the encoding's lengths (4 GiB).
#[derive(Debug)]
pub(crate) struct TooLarge;

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value of 4 GiB or more")
    }
}

thread_local! {
    /// The bytes of the values being parsed on this thread: each parse writes at the end, then
    /// copies its value out ([`capture`]) and takes it off.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `f` on this thread's scratch buffer; never held across a parse's nested calls.
fn with<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    SCRATCH.with_borrow_mut(f)
}

/// The value that `write` writes on the scratch buffer, copied into an allocation of its size;
/// the scratch buffer is left as it was, whether `write` fails or not.
pub(crate) fn capture<E>(write: impl FnOnce() -> Result<(), E>) -> Result<TreeBuf, E> {
    let start = with(|b| b.len());
    let written = write();
    with(|b| {
        let tree = written.map(|()| TreeBuf(b[start..].into()));
        b.truncate(start);
        if start == 0 && b.capacity() > 1 << 20 {
            // A huge value once: do not keep its room for the thread's life.
            b.shrink_to(64 << 10);
        }
        tree
    })
}

fn put_int(b: &mut Vec<u8>, v: i64) {
    if let Ok(tiny) = i8::try_from(v) {
        b.push(TINY_INT);
        b.push(tiny as u8);
        return;
    }
    match i32::try_from(v) {
        Ok(small) => {
            b.push(SMALL_INT);
            b.extend_from_slice(&small.to_le_bytes());
        }
        Err(_) => {
            b.push(INT);
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
}

fn put_uint(b: &mut Vec<u8>, v: u64) {
    match i64::try_from(v) {
        Ok(i) => put_int(b, i),
        Err(_) => {
            b.push(UINT);
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
}

fn put_float(b: &mut Vec<u8>, v: f64) {
    b.push(FLOAT);
    b.extend_from_slice(&v.to_bits().to_le_bytes());
}

fn put_string(b: &mut Vec<u8>, s: &str) -> Result<(), TooLarge> {
    if s.len() < SHORT_STRINGS {
        b.push(SHORT_STRING + s.len() as u8);
    } else {
        let len = u32::try_from(s.len()).map_err(|_| TooLarge)?;
        b.push(LONG_STRING);
        b.extend_from_slice(&len.to_le_bytes());
    }
    b.extend_from_slice(s.as_bytes());
    Ok(())
}

/// Writes `key`, interned when it is one of [`keys::NAMES`]. A key of 4 GiB or more cannot
/// be: the text it came from would be larger.
fn put_key(b: &mut Vec<u8>, key: &str) {
    put_code(b, keys::lookup(key), key);
}

fn put_code(b: &mut Vec<u8>, named: Option<usize>, key: &str) {
    match named {
        Some(i) if i < usize::from(NAMED_SHORT) => b.push(i as u8),
        Some(i) => {
            let [high, low] = (i as u16).to_be_bytes();
            b.extend_from_slice(&[NAMED_SHORT + high, low]);
        }
        None if key.len() < usize::from(LONG_KEY - INLINE_KEY) => {
            b.push(INLINE_KEY + key.len() as u8);
            b.extend_from_slice(key.as_bytes());
        }
        None => {
            b.push(LONG_KEY);
            b.extend_from_slice(&(key.len() as u32).to_le_bytes());
            b.extend_from_slice(key.as_bytes());
        }
    }
}

/// A map or an array being written on the scratch buffer: its tag, room for its length, then
/// its contents; [`Self::finish`] writes the length.
pub(crate) struct Container {
    at: usize,
}

/// Where an entry's value is being written, and the value it replaces when its key was there.
pub(crate) struct Entry {
    value: usize,
    replaces: Option<(usize, usize)>,
}

impl Container {
    fn start(tag: u8) -> Container {
        with(|b| {
            let at = b.len();
            b.extend_from_slice(&[tag, 0, 0, 0, 0]);
            Container { at }
        })
    }

    pub(crate) fn object() -> Container {
        Container::start(OBJECT)
    }

    /// Starts the entry of `key`, whose value is to be written next, then given to
    /// [`Self::end_entry`]. A repeated key keeps its last value, in the place of its first,
    /// as `serde_json` does: the entries written are searched, an interned key by its place.
    pub(crate) fn key(&mut self, key: &str) -> Entry {
        let named = keys::lookup(key);
        with(|b| {
            let mut at = self.at + HEAD;
            while at < b.len() {
                let (code, len) = key_at(&b[at..]);
                let same = match code {
                    KeyCode::Named(i) => named == Some(usize::from(i)),
                    KeyCode::Text(t) => named.is_none() && t == key.as_bytes(),
                };
                let value = at + len;
                let end = value + value_len(&b[value..]);
                if same {
                    return Entry {
                        value: b.len(),
                        replaces: Some((value, end)),
                    };
                }
                at = end;
            }
            put_code(b, named, key);
            Entry {
                value: b.len(),
                replaces: None,
            }
        })
    }

    /// Ends an entry once its value is written: a repeated key's value moves into its first
    /// place.
    pub(crate) fn end_entry(&mut self, entry: Entry) {
        if let Some((start, end)) = entry.replaces {
            with(|b| {
                let value = b.split_off(entry.value);
                b.splice(start..end, value);
            });
        }
    }

    /// Writes the container's length, in the smallest head that holds it ([`close`]).
    pub(crate) fn finish(self) -> Result<(), TooLarge> {
        with(|b| close(b, self.at))
    }
}

/// The length of the scratch buffer: where the next value would be written.
pub(crate) fn mark() -> usize {
    with(|b| b.len())
}

/// Takes off the scratch buffer what was written since `mark`.
pub(crate) fn unwrite(mark: usize) {
    with(|b| b.truncate(mark));
}

/// How far ahead of the object being read its tree is prefetched.
const AHEAD: usize = 4;

/// The trees of `objects` in order, each prefetched ([`Tree::prefetch`]) a few objects ahead of
/// its reading when `prefetch`: a pass over a group too large for the caches otherwise waits
/// for memory at each object it enters. See [`super::PREFETCH_FROM`].
pub fn prefetched<T: Borrow<Tree>>(
    objects: &[T],
    prefetch: bool,
) -> impl Iterator<Item = &Tree> + '_ {
    objects.iter().enumerate().map(move |(i, object)| {
        if prefetch {
            if let Some(next) = objects.get(i + AHEAD) {
                next.borrow().prefetch();
            }
        }
        object.borrow()
    })
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
    pub fn parse(self, text: &str) -> serde_json::Result<TreeBuf> {
        capture(|| self.write(text))
    }

    /// Writes the `self` part of `text` on the scratch buffer, as [`Write`] does.
    pub(crate) fn write(self, text: &str) -> serde_json::Result<()> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        Write(self).deserialize(&mut deserializer)?;
        deserializer.end()
    }

    /// The rule for the field `key` of a map read under this rule; `None` to skip it.
    pub(crate) fn field(self, key: &str) -> Option<Keep> {
        match self {
            Keep::All => Some(Keep::All),
            Keep::Fields(fields) => fields.iter().find(|(name, _)| *name == key).map(|f| f.1),
        }
    }
}

impl<'de> Deserialize<'de> for TreeBuf {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TreeBuf, D::Error> {
        Keep::All.deserialize(deserializer)
    }
}

impl<'de> DeserializeSeed<'de> for Keep {
    type Value = TreeBuf;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<TreeBuf, D::Error> {
        capture(|| Write(self).deserialize(deserializer))
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

/// [`Keep`]'s parse, writing the value on the scratch buffer (taken off by [`capture`]).
pub(crate) struct Write(pub(crate) Keep);

impl<'de> DeserializeSeed<'de> for Write {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

fn too_large<E: serde::de::Error>(_: TooLarge) -> E {
    E::custom(TooLarge)
}

impl<'de> Visitor<'de> for Write {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut object = Container::object();
        while let Some(TextKey(key)) = map.next_key()? {
            let Some(keep) = self.0.field(&key) else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let entry = object.key(&key);
            map.next_value_seed(Write(keep))?;
            object.end_entry(entry);
        }
        object.finish().map_err(too_large)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let array = Container::start(ARRAY);
        while seq.next_element_seed(Write(self.0))?.is_some() {}
        array.finish().map_err(too_large)
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        with(|b| b.push(if v { TRUE } else { FALSE }));
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        with(|b| put_int(b, v));
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        with(|b| put_uint(b, v));
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        with(|b| put_float(b, v));
        Ok(())
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        with(|b| put_string(b, v)).map_err(too_large)
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        with(|b| b.push(NULL));
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        with(|b| b.push(NULL));
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.deserialize(deserializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use serde_json::{json, Value};

    fn parsed(text: &str) -> TreeBuf {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn reads_as_serde_json_reads() {
        let value = json!({"a": [1, -2, 3.5, 18446744073709551615u64, true, null, "x"],
                           "b": {"c": "a string longer than twenty-four bytes", "d": {}}, "": ""});
        let tree = parsed(&value.to_string());
        assert_eq!(
            tree,
            TreeBuf::from(&value),
            "the same value, the same bytes"
        );
        assert_eq!(Value::from(&tree), value);
        let a = tree.get("a").and_then(Tree::as_array).unwrap();
        let as_i64: Vec<_> = a.iter().map(Tree::as_i64).collect();
        let expected: Vec<_> = value["a"]
            .as_array()
            .unwrap()
            .iter()
            .map(Value::as_i64)
            .collect();
        assert_eq!(as_i64, expected);
        let as_f64: Vec<_> = a.iter().map(Tree::as_f64).collect();
        let expected: Vec<_> = value["a"]
            .as_array()
            .unwrap()
            .iter()
            .map(Value::as_f64)
            .collect();
        assert_eq!(as_f64, expected);
        assert_eq!(a.len(), 7);
        assert_eq!(a.get(4).and_then(Tree::as_bool), Some(true));
        assert!(a.get(5).unwrap().is_null() && a.get(6).unwrap().is_string());
        assert!(a.get(7).is_none());
        let b = tree.get("b").unwrap();
        assert_eq!(
            b.get("c").and_then(Tree::as_str),
            Some("a string longer than twenty-four bytes")
        );
        let d = b.get("d").unwrap();
        assert!(d.is_object() && d.as_object().unwrap().is_empty());
        assert_eq!(tree.get("").and_then(Tree::as_str), Some(""));
        assert_eq!(tree.get("nope"), None);
        assert_eq!(TreeBuf::from(&json!(1)).get("a"), None);
        assert_eq!(TreeBuf::from(&json!("x")).as_array().map(|a| a.len()), None);
    }

    #[test]
    fn keys_with_escapes_read_as_serde_json_reads_them() {
        let text = r#"{"a\"b": 1, "k\u00e9y": {"x\ny": [{"\\": 2}]}, "plain": 3}"#;
        let tree = parsed(text);
        let value: Value = serde_json::from_str(text).unwrap();
        assert_eq!(Value::from(&tree), value);
        let inner = tree.get("kéy").and_then(|k| k.get("x\ny"));
        assert!(inner.and_then(Tree::as_array).is_some_and(|a| a
            .first()
            .unwrap()
            .get("\\")
            .is_some()));
        assert_eq!(tree.get("a\"b").and_then(Tree::as_i64), Some(1));
        let kept = Keep::Fields(&[("kéy", Keep::All)]).parse(text).unwrap();
        assert_eq!(Value::from(&kept), json!({"kéy": value["kéy"]}));
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value_in_the_place_of_its_first() {
        let text = r#"{"a": 1, "b": 2, "a": 3}"#;
        let tree = parsed(text);
        assert_eq!(tree.get("a").and_then(Tree::as_i64), Some(3));
        let keys: Vec<_> = tree.as_object().unwrap().iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(
            Value::from(&tree),
            serde_json::from_str::<Value>(text).unwrap()
        );
        // Values of other sizes, nested, interned keys and not, and a map after them: the
        // replaced value's bytes move and the lengths around them still hold.
        let text = r#"{"metadata": {"name": "a-longer-first-name", "x-key": [1, 2, {"q": 1}],
            "name": "b", "x-key": {}, "uid": "u"}, "spec": {"k": "v"},
            "metadata": {"labels": {"l": "1"}, "labels": {"l": "2", "m": "3"}}, "z": 1}"#;
        for keep in [
            Keep::All,
            Keep::Fields(&[
                ("metadata", Keep::All),
                ("spec", Keep::All),
                ("z", Keep::All),
            ]),
        ] {
            let tree = keep.parse(text).unwrap();
            assert_eq!(
                Value::from(&tree),
                json!({"metadata": {"labels": {"l": "2", "m": "3"}}, "spec": {"k": "v"}, "z": 1})
            );
            let keys: Vec<_> = tree.as_object().unwrap().iter().map(|(k, _)| k).collect();
            assert_eq!(keys, ["metadata", "spec", "z"]);
            let labels = tree.get("metadata").and_then(|m| m.get("labels")).unwrap();
            let keys: Vec<_> = labels.as_object().unwrap().iter().map(|(k, _)| k).collect();
            assert_eq!(keys, ["l", "m"]);
        }
        let first =
            parsed(r#"{"metadata": {"name": "n", "name": "much-longer-name", "uid": "u"}}"#);
        let keys: Vec<_> = first
            .get("metadata")
            .unwrap()
            .as_object()
            .unwrap()
            .iter()
            .collect();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].0, "name");
        assert_eq!(keys[0].1.as_str(), Some("much-longer-name"));
        assert_eq!(keys[1].1.as_str(), Some("u"));
    }

    #[test]
    fn a_failed_parse_leaves_nothing_behind_for_the_next() {
        // Errors deep inside maps and arrays, of both readers; the scratch is back as it was.
        let before = mark();
        for bad in [
            r#"{"a": {"b": [1, {"c": "x", "d": ]}]}}"#,
            r#"{"a": 1, "b": [[2, 3], {"e": tru}]"#,
            r#"[{"a": 1}, {"b": 2"#,
        ] {
            assert!(serde_json::from_str::<TreeBuf>(bad).is_err(), "{bad}");
            assert!(Keep::Fields(&[("a", Keep::All), ("b", Keep::All)])
                .parse(bad)
                .is_err());
            assert_eq!(mark(), before, "{bad}");
        }
        let good = json!({"a": {"b": [1, {"c": "x"}]}, "z": [[], {}]});
        assert_eq!(Value::from(&parsed(&good.to_string())), good);
        assert_eq!(mark(), before);
    }

    #[test]
    fn keep_builds_only_the_named_fields() {
        const KEEP: Keep =
            Keep::Fields(&[("a", Keep::All), ("b", Keep::Fields(&[("c", Keep::All)]))]);
        let text = r#"{"a": {"x": [1]}, "b": [{"c": 1, "d": 2}, 3, {"d": {"e": []}}], "z": {"deep": [[[]]]}}"#;
        assert_eq!(
            Value::from(&KEEP.parse(text).unwrap()),
            json!({"a": {"x": [1]}, "b": [{"c": 1}, 3, {}]})
        );
        assert!(KEEP.parse(r#"{"a": "#).is_err());
        assert!(KEEP.parse("{} {}").is_err());
        assert_eq!(
            KEEP.parse("[1, null]").unwrap(),
            TreeBuf::from(&json!([1, null]))
        );
    }

    #[test]
    fn strings_sit_inline_with_their_length_short_or_long() {
        for len in [0, 1, 24, SHORT_STRINGS - 1, SHORT_STRINGS, 70_000] {
            let s = "é".repeat(len / 2) + &"x".repeat(len % 2);
            assert_eq!(s.len(), len);
            let tree = TreeBuf::from(&json!(s));
            let head = if len < SHORT_STRINGS { 1 } else { HEAD };
            assert_eq!(tree.bytes(), head + len, "{len}");
            assert_eq!(tree.as_str(), Some(s.as_str()));
            assert!(tree.is_string() && !tree.is_object() && tree.as_i64().is_none());
            assert_eq!(parsed(&json!(s).to_string()), tree);
            assert_eq!(Value::from(&tree), json!(s));
        }
        let escaped = parsed(r#""tab\there \"quoted\" \u00e9 \ud83d\ude00""#);
        assert_eq!(escaped.as_str(), Some("tab\there \"quoted\" é 😀"));
    }

    #[test]
    fn numbers_keep_their_kind_in_the_smallest_room() {
        let cases: [(Value, usize); 13] = [
            (json!(0), 2),
            (json!(-1), 2),
            (json!(127), 2),
            (json!(-128), 2),
            (json!(128), 5),
            (json!(-129), 5),
            (json!(i32::MAX), 5),
            (json!(i32::MIN), 5),
            (json!(i64::from(i32::MAX) + 1), 9),
            (json!(i64::MIN), 9),
            (json!(u64::MAX), 9),
            (json!(0.5), 9),
            (json!(-1e300), 9),
        ];
        for (value, bytes) in cases {
            let tree = TreeBuf::from(&value);
            assert_eq!(tree.bytes(), bytes, "{value}");
            assert_eq!(tree.as_i64(), value.as_i64(), "{value}");
            assert_eq!(tree.as_f64(), value.as_f64(), "{value}");
            assert_eq!(Value::from(&tree), value);
            assert_eq!(parsed(&value.to_string()), tree, "{value}");
        }
        assert_eq!(TreeBuf::from(&json!(true)).bytes(), 1);
        assert_eq!(TreeBuf::default(), TreeBuf::from(&Value::Null));
    }

    #[test]
    fn empty_containers_and_keys_interned_or_inline() {
        assert_eq!(TreeBuf::from(&json!({})).bytes(), 2);
        assert_eq!(TreeBuf::from(&json!([])).bytes(), 2);
        assert!(TreeBuf::from(&json!([])).as_array().unwrap().is_empty());
        // One of the first interned names takes a byte, a later one two; another key its
        // length more than one, up to 62 bytes, then five more.
        let named = TreeBuf::from(&json!({"metadata": null}));
        assert_eq!(named.bytes(), 2 + 1 + 1);
        let last = keys::NAMES[keys::NAMES.len() - 1];
        assert!(keys::NAMES.len() > 128);
        let later = TreeBuf::from(&json!({ last: null }));
        assert_eq!(later.bytes(), 2 + 2 + 1);
        assert!(later.get(last).is_some_and(Tree::is_null));
        assert_eq!(later.as_object().unwrap().iter().next().unwrap().0, last);
        let other = TreeBuf::from(&json!({"not-a-kubernetes-key": null}));
        assert_eq!(other.bytes(), 2 + 1 + 20 + 1);
        let k62 = "k".repeat(62);
        let k63 = "k".repeat(63);
        let inline = TreeBuf::from(&json!({ k62.as_str(): 1, k63.as_str(): 2 }));
        assert_eq!(inline.bytes(), 2 + (1 + 62 + 2) + (5 + 63 + 2));
        assert_eq!(inline.get(&k62).and_then(Tree::as_i64), Some(1));
        assert_eq!(inline.get(&k63).and_then(Tree::as_i64), Some(2));
        let long = "k".repeat(40_000);
        let tree = TreeBuf::from(&json!({ long.as_str(): 1, "metadata": 2 }));
        assert_eq!(tree.bytes(), 3 + 5 + 40_000 + 2 + 1 + 2);
        assert_eq!(tree.get(&long).and_then(Tree::as_i64), Some(1));
        assert_eq!(tree.get("metadata").and_then(Tree::as_i64), Some(2));
        assert_eq!(tree.as_object().unwrap().len(), 2);
        // An interned name is never found as an inline key, nor the reverse.
        assert_eq!(tree.get("kind"), None);
        assert_eq!(other.get("metadata"), None);
    }

    #[test]
    fn a_container_is_stepped_over_by_its_length() {
        let deep =
            json!({"a": [{"b": {"c": [[1, 2], {"d": "x".repeat(300)}]}}, [], {}], "z": "after"});
        let tree = TreeBuf::from(&deep);
        let a = tree.get("a").unwrap();
        assert_eq!(a.bytes(), TreeBuf::from(&deep["a"]).bytes());
        assert_eq!(tree.get("z").and_then(Tree::as_str), Some("after"));
        let items: Vec<Value> = a.as_array().unwrap().map(Value::from).collect();
        assert_eq!(items, deep["a"].as_array().unwrap().clone());
        let key = |k: &str| match keys::lookup(k) {
            Some(i) if i < 128 => 1,
            Some(_) => 2,
            None => 1 + k.len(),
        };
        let contents = key("a") + a.bytes() + key("z") + 1 + "after".len();
        assert!(contents > 255 && contents < 65_536);
        assert_eq!(tree.bytes(), 3 + contents);
    }

    #[test]
    fn a_container_s_length_takes_one_two_or_four_bytes() {
        // Contents of 255 and 256 bytes, 65,535 and 65,536: as many `true`s, a byte each.
        for (contents, head) in [(255, 2), (256, 3), (65_535, 3), (65_536, 5), (300_000, 5)] {
            let items = vec![json!(true); contents];
            let array = json!(items);
            let tree = TreeBuf::from(&array);
            assert_eq!(tree.bytes(), head + contents, "{contents}");
            assert_eq!(parsed(&array.to_string()), tree);
            assert_eq!(Value::from(&tree), array);
            assert!(tree.is_array() && !tree.is_object());
            // The same contents as an object's entry, and the object in a map: stepped over
            // by their lengths whatever the heads.
            let object = json!({"a": array, "z": {"in": array}, "after": 1});
            let tree = TreeBuf::from(&object);
            assert_eq!(Value::from(&tree), object);
            assert_eq!(tree.get("after").and_then(Tree::as_i64), Some(1));
            assert_eq!(
                tree.get("z").and_then(|z| z.get("in")).map(|a| a.bytes()),
                Some(head + contents)
            );
            assert_eq!(parsed(&object.to_string()), tree);
        }
    }

    #[test]
    fn set_strings_sets_in_place_or_after() {
        let mut tree = TreeBuf::from(&json!({"kind": 1, "metadata": {"name": "n"}}));
        tree.set_strings(&[("apiVersion", "v1"), ("kind", "Pod")]);
        let keys: Vec<_> = tree.as_object().unwrap().iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["kind", "metadata", "apiVersion"]);
        assert_eq!(
            Value::from(&tree),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "n"}})
        );
        let mut array = TreeBuf::from(&json!([1]));
        array.set_strings(&[("kind", "Pod")]);
        assert_eq!(array, TreeBuf::from(&json!([1])));
    }

    /// A random JSON value: every kind, nested to `depth`, keys interned or not, repeated.
    fn random(rng: &mut impl Rng, depth: u32) -> Value {
        let later = keys::NAMES[keys::NAMES.len() - 1];
        let keys = [
            "name", "metadata", "x", "", "uid", "a-key", "é", "status", later,
        ];
        let string = |rng: &mut dyn rand::RngCore| -> String {
            let len = *[0, 1, 5, 23, 24, 25, 239, 240, 300]
                .get(rng.random_range(0..9))
                .unwrap();
            (0..len)
                .map(|i| if i % 7 == 3 { 'é' } else { 'a' })
                .collect()
        };
        match rng.random_range(0..if depth == 0 { 7 } else { 9 }) {
            0 => Value::Null,
            1 => json!(rng.random::<bool>()),
            2 => json!(rng.random_range(-1000..1000)),
            3 => json!(rng.random::<i64>()),
            4 => json!(rng.random::<u64>()),
            5 => json!(rng.random::<f64>() * 1e6),
            6 => json!(string(rng)),
            7 => Value::Array(
                (0..rng.random_range(0..5))
                    .map(|_| random(rng, depth - 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..rng.random_range(0..6))
                    .map(|_| {
                        let key = match rng.random_range(0..3) {
                            0 => string(rng),
                            _ => keys[rng.random_range(0..keys.len())].to_owned(),
                        };
                        (key, random(rng, depth - 1))
                    })
                    .collect(),
            ),
        }
    }

    /// Every reading of `tree` as `value` reads.
    fn same(tree: &Tree, value: &Value) {
        assert_eq!(tree.is_null(), value.is_null());
        assert_eq!(tree.as_bool(), value.as_bool());
        assert_eq!(tree.as_i64(), value.as_i64());
        assert_eq!(tree.as_f64(), value.as_f64());
        assert_eq!(tree.as_str(), value.as_str());
        assert_eq!(tree.is_object(), value.is_object());
        match value {
            Value::Array(items) => {
                let tree_items = tree.as_array().unwrap();
                assert_eq!(tree_items.len(), items.len());
                tree_items.zip(items).for_each(|(t, v)| same(t, v));
            }
            Value::Object(map) => {
                let tree_map = tree.as_object().unwrap();
                assert_eq!(tree_map.len(), map.len());
                for (key, v) in map {
                    same(tree_map.get(key).unwrap(), v);
                }
                assert!(tree_map.iter().all(|(k, _)| map.contains_key(k)));
            }
            _ => assert!(tree.as_array().is_none() && tree.as_object().is_none()),
        }
    }

    #[test]
    fn random_json_reads_as_serde_json_reads_it() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        for _ in 0..2_000 {
            // As serde_json reads its own text back (its floats do not always round-trip).
            let text = random(&mut rng, 4).to_string();
            let value: Value = serde_json::from_str(&text).unwrap();
            let tree = parsed(&text);
            assert_eq!(Value::from(&tree), value, "{text}");
            assert_eq!(tree, TreeBuf::from(&value), "{text}");
            same(&tree, &value);
            // The same text with every object's keys given twice, the first time with null:
            // the last value stays, in the place of the first.
            let doubled = double_keys(&value);
            assert_eq!(Value::from(&parsed(&doubled)), value, "{doubled}");
        }
    }

    /// `value`'s text with each entry preceded by the same key with `null`.
    fn double_keys(value: &Value) -> String {
        match value {
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(double_keys).collect();
                format!("[{}]", items.join(","))
            }
            Value::Object(map) => {
                let entries: Vec<String> = map
                    .iter()
                    .map(|(k, v)| {
                        let k = Value::from(k.as_str());
                        format!("{k}:null,{k}:{}", double_keys(v))
                    })
                    .collect();
                format!("{{{}}}", entries.join(","))
            }
            other => other.to_string(),
        }
    }

    #[test]
    fn prefetched_trees_come_in_order_whatever_their_shape() {
        let shapes = [
            json!({"a": {"b": [{"c": {"d": [1, "x"]}}, null]}, "e": "a string longer than inline"}),
            json!([[[[[]]]], {}, 2.5, true]),
            json!("text"),
            json!(null),
            json!({}),
        ];
        for n in [0, 1, 3, 9, 40] {
            let trees: Vec<TreeBuf> = (0..n)
                .map(|i| TreeBuf::from(&shapes[i % shapes.len()]))
                .collect();
            for prefetch in [false, true] {
                let read: Vec<&Tree> = prefetched(&trees, prefetch).collect();
                assert_eq!(read, trees.iter().map(|t| &**t).collect::<Vec<_>>());
            }
        }
    }
}
