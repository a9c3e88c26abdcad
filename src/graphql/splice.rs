//! Pre-rendered JSON in an answer, without a `Value` tree.
//!
//! async-graphql builds a `Value` tree for every answer and serializes it: for the 1,000
//! resources of a warm resource group that is some 20 M instructions a view, spent writing the
//! same text as the view before. It has no raw-JSON value, so a field whose text is already
//! rendered answers a [`Splices::placeholder`] instead: a string nobody can guess (a random
//! token per request or connection, and a counter), leaving its text here; whoever serializes
//! the answer (the HTTP handler of `/api/graphql`, the subscriptions' socket) then
//! [`Splices::splice`]s the text in place of each quoted placeholder.
//!
//! Only those two put a `Splices` in the request's data, and both splice every answer they
//! send, so a placeholder never reaches a client: whoever else executes a document (the
//! dashboard's pages, the history) has no `Splices`, and its fields answer async-graphql's own
//! values. A placeholder that does not appear in the answer (a field nulled by an error beside
//! it) leaves its text unused.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use async_graphql::parser::types::{Selection, SelectionSet};
use async_graphql::Value;
use bytes::Bytes;

/// Placeholders waiting for their answer. A request's lives as long as the request; a
/// socket's as long as its connection.
pub struct Splices {
    /// `envlens.splice.<128 random bits in hex>.`; a placeholder adds its number.
    token: String,
    pending: Mutex<Pending>,
    /// Texts kept waiting at most, the oldest given up past it (see [`Splices::for_socket`]).
    limit: usize,
}

#[derive(Default)]
struct Pending {
    next: u64,
    texts: VecDeque<(u64, Bytes)>,
}

/// A socket keeps no more texts than this waiting: each is spliced into the message that
/// follows its resolution (a connection has at most 20 subscriptions), so more waiting can
/// only be texts of fields nulled by an error, which nobody will ask for.
const MAX_PENDING: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Default for Splices {
    fn default() -> Self {
        Self::new()
    }
}

impl Splices {
    /// A request's: it lives as long as the request, and keeps every text until the answer is
    /// serialized.
    pub fn new() -> Self {
        let bits: u128 = rand::random();
        Splices {
            token: format!("envlens.splice.{bits:032x}."),
            pending: Mutex::default(),
            limit: usize::MAX,
        }
    }

    /// A connection's: it lives as long as the socket, so it keeps at most [`MAX_PENDING`].
    pub fn for_socket() -> Self {
        Splices {
            limit: MAX_PENDING,
            ..Self::new()
        }
    }

    /// The value a field answers for `json` (the JSON text of its value).
    pub fn placeholder(&self, json: Bytes) -> Value {
        let mut pending = lock(&self.pending);
        let n = pending.next;
        pending.next += 1;
        if pending.texts.len() >= self.limit {
            pending.texts.pop_front();
        }
        pending.texts.push_back((n, json));
        Value::String(format!("{}{n}", self.token))
    }

    /// Whether no placeholder waits (the answer is to be sent as it is).
    pub fn is_empty(&self) -> bool {
        lock(&self.pending).texts.is_empty()
    }

    /// `text` (a serialized answer) as pieces whose concatenation is the answer: slices of
    /// `text` and, in place of each quoted placeholder, its JSON. The spliced texts are taken
    /// out; the pieces share their bytes.
    pub fn splice(&self, text: Bytes) -> Vec<Bytes> {
        let needle = format!("\"{}", self.token);
        let mut pieces = Vec::new();
        let mut start = 0;
        let mut from = 0;
        while let Some(found) = find(&text[from..], needle.as_bytes()) {
            let at = from + found;
            let digits = at + needle.len();
            let end = text[digits..]
                .iter()
                .position(|b| !b.is_ascii_digit())
                .map_or(text.len(), |n| digits + n);
            from = digits;
            if end == digits || text.get(end) != Some(&b'"') {
                continue;
            }
            let Some(n) = std::str::from_utf8(&text[digits..end])
                .ok()
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let json = {
                let mut pending = lock(&self.pending);
                let index = pending.texts.iter().position(|(m, _)| *m == n);
                index
                    .and_then(|i| pending.texts.remove(i))
                    .map(|(_, json)| json)
            };
            let Some(json) = json else { continue };
            if at > start {
                pieces.push(text.slice(start..at));
            }
            pieces.push(json);
            start = end + 1;
            from = start;
        }
        if start < text.len() || pieces.is_empty() {
            pieces.push(text.slice(start..));
        }
        pieces
    }
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let first = *needle.first()?;
    let mut from = 0;
    while let Some(i) = haystack[from..].iter().position(|&b| b == first) {
        let at = from + i;
        if haystack[at..].starts_with(needle) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// The pieces of [`Splices::splice`] as an HTTP body: sent as they are, the shared texts not
/// copied; its length is known, so the answer has its `Content-Length`.
pub struct Body {
    pieces: VecDeque<Bytes>,
    left: u64,
}

impl Body {
    pub fn new(pieces: Vec<Bytes>) -> Self {
        let left = pieces.iter().map(|p| p.len() as u64).sum();
        Body {
            pieces: pieces.into(),
            left,
        }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let body = self.get_mut();
        let piece = body.pieces.pop_front();
        if let Some(piece) = &piece {
            body.left -= piece.len() as u64;
        }
        std::task::Poll::Ready(piece.map(|p| Ok(http_body::Frame::data(p))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left)
    }
}

/// The pieces of [`Splices::splice`] as one buffer.
pub fn concat(pieces: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(pieces.iter().map(Bytes::len).sum());
    for piece in pieces {
        out.extend_from_slice(piece);
    }
    out
}

/// What makes two plain selections answer the same text: each field's response key and name,
/// in order, and so on down (a plain selection has no fragment and no directive; see
/// `plain::is_plain`).
pub fn fingerprint(selection: &SelectionSet, out: &mut String) {
    out.push('{');
    for item in &selection.items {
        if let Selection::Field(field) = &item.node {
            let field = &field.node;
            out.push_str(field.response_key().node.as_str());
            out.push(':');
            out.push_str(field.name.node.as_str());
            if !field.selection_set.node.items.is_empty() {
                fingerprint(&field.selection_set.node, out);
            }
            out.push(',');
        }
    }
    out.push('}');
}

/// The JSON of one value, rendered for each selection asked of it. A feed's message keeps
/// one (every subscriber with the same selection shares its text).
#[derive(Default)]
pub struct PerSelection {
    texts: Mutex<Vec<(String, Bytes)>>,
}

/// Distinct selections of one value kept at most (a selection is a client's choice).
const MAX_SELECTIONS: usize = 8;

impl PerSelection {
    /// The bytes of the texts kept.
    fn bytes(&self) -> usize {
        lock(&self.texts)
            .iter()
            .map(|(k, t)| k.len() + t.len())
            .sum()
    }

    /// The text for `key` (a [`fingerprint`]), rendered by `render` when not yet kept.
    pub fn get_or_render(&self, key: &str, render: impl FnOnce() -> Value) -> Bytes {
        if let Some((_, json)) = lock(&self.texts).iter().find(|(k, _)| k == key) {
            return json.clone();
        }
        // Rendered outside the lock: another selection need not wait for this one.
        let json = to_json(&render());
        let mut texts = lock(&self.texts);
        if let Some((_, kept)) = texts.iter().find(|(k, _)| k == key) {
            return kept.clone();
        }
        if texts.len() >= MAX_SELECTIONS {
            texts.remove(0);
        }
        texts.push((key.to_owned(), json.clone()));
        json
    }
}

/// `value` as async-graphql's answers serialize it (serde_json, compact).
pub fn to_json(value: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec()))
}

/// Rendered texts of values shared between requests (the watch cache's memoised groups), by
/// the value's identity: an entry holds a `Weak` of it, so its address is not reused while
/// the entry lives, and the entry goes once the value is dropped everywhere else.
pub struct Rendered<T> {
    entries: Mutex<VecDeque<(Weak<T>, Arc<PerSelection>)>>,
}

/// Shared values whose texts are kept at most (the most recently used), and their bytes: a
/// group of 1,000 resources is some 0.7 MB of text without manifests, a few with them.
const MAX_VALUES: usize = 16;
const MAX_BYTES: usize = 64 << 20;

impl<T> Default for Rendered<T> {
    fn default() -> Self {
        Rendered {
            entries: Mutex::default(),
        }
    }
}

impl<T> Rendered<T> {
    /// The texts kept for `value`, a new empty set when none are.
    pub fn of(&self, value: &Arc<T>) -> Arc<PerSelection> {
        let mut entries = lock(&self.entries);
        entries.retain(|(weak, _)| weak.strong_count() > 0);
        let mut bytes: usize = entries.iter().map(|(_, texts)| texts.bytes()).sum();
        while bytes > MAX_BYTES && entries.len() > 1 {
            if let Some((_, oldest)) = entries.pop_front() {
                bytes = bytes.saturating_sub(oldest.bytes());
            }
        }
        let ptr = Arc::as_ptr(value);
        let found = entries.iter().position(|(weak, _)| weak.as_ptr() == ptr);
        if let Some(entry) = found.and_then(|i| entries.remove(i)) {
            let texts = entry.1.clone();
            entries.push_back(entry);
            return texts;
        }
        if entries.len() >= MAX_VALUES {
            entries.pop_front();
        }
        let texts = Arc::new(PerSelection::default());
        entries.push_back((Arc::downgrade(value), texts.clone()));
        texts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(splices: &Splices, text: String) -> String {
        String::from_utf8(concat(&splices.splice(Bytes::from(text)))).unwrap()
    }

    #[test]
    fn placeholders_are_replaced_by_their_text_and_nothing_else_is() {
        let splices = Splices::new();
        let a = splices.placeholder(Bytes::from_static(b"[1,2]"));
        let b = splices.placeholder(Bytes::from_static(b"{\"x\":\"y\"}"));
        let text = serde_json::to_string(&serde_json::json!({
            "a": a.clone().into_json().unwrap(),
            "lookalike": format!("{}7", splices.token),
            "b": b.into_json().unwrap(),
        }))
        .unwrap();
        assert_eq!(
            answer(&splices, text),
            format!(
                r#"{{"a":[1,2],"b":{{"x":"y"}},"lookalike":"{}7"}}"#,
                splices.token
            )
        );
        assert!(splices.is_empty(), "the texts were taken");
        // A placeholder whose text was taken, or another request's, stays a string.
        let again = serde_json::to_string(&a.into_json().unwrap()).unwrap();
        assert_eq!(answer(&splices, again.clone()), again);
        let other = Splices::new();
        assert_ne!(other.token, splices.token);
        assert_eq!(answer(&other, again.clone()), again);
    }

    #[test]
    fn an_answer_without_placeholders_is_one_piece_of_itself() {
        let splices = Splices::new();
        let pieces = splices.splice(Bytes::from_static(b"{\"data\":null}"));
        assert_eq!(pieces, vec![Bytes::from_static(b"{\"data\":null}")]);
        assert_eq!(
            splices.splice(Bytes::new()).concat(),
            Vec::<u8>::new(),
            "empty"
        );
    }

    #[tokio::test]
    async fn a_body_of_pieces_is_their_concatenation_of_known_length() {
        use http_body::Body as _;
        use http_body_util::BodyExt;
        let pieces = vec![
            Bytes::from_static(b"{\"a\":"),
            Bytes::from_static(b"[1,2]"),
            Bytes::from_static(b"}"),
        ];
        let body = Body::new(pieces.clone());
        assert_eq!(body.size_hint().exact(), Some(11));
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(&collected[..], &concat(&pieces)[..]);
    }

    #[test]
    fn a_socket_keeps_a_bounded_number_of_texts_waiting() {
        let splices = Splices::for_socket();
        for _ in 0..MAX_PENDING * 2 {
            splices.placeholder(Bytes::from_static(b"1"));
        }
        assert_eq!(lock(&splices.pending).texts.len(), MAX_PENDING);
    }

    #[test]
    fn texts_are_kept_by_identity_while_the_value_lives() {
        let rendered = Rendered::<Vec<u8>>::default();
        let value = Arc::new(vec![1]);
        let same_content = Arc::new(vec![1]);
        let mut renders = 0;
        let mut text = |v: &Arc<Vec<u8>>, key: &str| {
            rendered.of(v).get_or_render(key, || {
                renders += 1;
                Value::from(v[0] as i32)
            })
        };
        assert_eq!(text(&value, "{a:a,}"), Bytes::from_static(b"1"));
        assert_eq!(text(&value, "{a:a,}"), Bytes::from_static(b"1"));
        text(&value, "{b:a,}");
        text(&same_content, "{a:a,}");
        assert_eq!(renders, 3, "per value and per selection");
        drop(value);
        drop(same_content);
        let next = Arc::new(vec![2]);
        rendered.of(&next);
        assert_eq!(lock(&rendered.entries).len(), 1, "dead values leave");
    }
}
