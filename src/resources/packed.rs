//! An object's kept text, packed: every `"key":` whose key is one of the interned names
//! ([`super::keys::KEYS`]) written as two bytes, every other byte as it was.
//!
//! The keys are a third to a half of a Kubernetes object's JSON (`"lastTransitionTime":` is
//! 21 bytes of every condition), and nearly all of them are names of Kubernetes' types: packing
//! them keeps a cached object within the size of its JSON without a compressor's cost (a deflate
//! of each object would cost more than its parse; this is one scan of the text and a lookup per
//! key). Unpacking is exact: the packed text gives back the text byte for byte.
//!
//! The two bytes are a mark (0x01 to 0x08) and an index (below 0x80). Valid JSON has no byte
//! below 0x20 but whitespace (0x09, 0x0A, 0x0D), so the marks cannot be mistaken for text; a
//! text that holds such bytes anyway (it is not valid JSON) is kept whole behind a 0x00.

use std::borrow::Cow;

use super::keys;

/// The first mark; marks go up to `FIRST_MARK + MARKS - 1`.
const FIRST_MARK: u8 = 0x01;
const MARKS: usize = 8;
/// Names per mark: the index byte stays ASCII, so a packed text is still UTF-8.
const PER_MARK: usize = 0x80;
/// Put before a text kept whole.
const WHOLE: u8 = 0x00;

const _: () = assert!(keys::KEYS.len() <= MARKS * PER_MARK);

fn is_mark(b: u8) -> bool {
    b < FIRST_MARK + MARKS as u8
}

/// `text` packed. Lossless for any text: [`unpack`] gives it back.
pub fn pack(text: &str) -> Box<str> {
    let bytes = text.as_bytes();
    if bytes.iter().any(|&b| is_mark(b)) {
        let mut whole = String::with_capacity(text.len() + 1);
        whole.push(WHOLE as char);
        whole.push_str(text);
        return whole.into_boxed_str();
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    // Outside strings (as at the start) the next quote opens one; inside, a backslash escapes
    // the byte after it.
    while let Some(open) = next_special(bytes, i) {
        if bytes[open] != b'"' {
            i = open + 1;
            continue;
        }
        let mut from = open + 1;
        let close = loop {
            match next_special(bytes, from) {
                Some(p) if bytes[p] == b'\\' => from = p + 2,
                other => break other,
            }
        };
        let Some(close) = close else { break };
        i = close + 1;
        if bytes.get(close + 1) != Some(&b':') {
            continue;
        }
        // A key with escapes is not a name of the table: its text is kept.
        if let Some(id) = keys::lookup(&text[open + 1..close]) {
            // Quotes are ASCII: the cuts fall between characters.
            out.push_str(&text[copied..open]);
            out.push(char::from(FIRST_MARK + (id / PER_MARK) as u8));
            out.push(char::from((id % PER_MARK) as u8));
            copied = close + 2;
            i = copied;
        }
    }
    out.push_str(&text[copied..]);
    out.into_boxed_str()
}

/// The place of the next `"` or `\\` from `from`, eight bytes at a time: the scan is most of
/// what packing costs, and the bytes between two quotes are a dozen on average.
fn next_special(bytes: &[u8], mut from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    while from + 8 <= bytes.len() {
        let word = u64::from_le_bytes(bytes[from..from + 8].try_into().unwrap_or([0; 8]));
        // A byte of `x` is zero where the byte of `word` is the one looked for.
        let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
        let found = zero(word ^ (ONES * u64::from(b'"'))) | zero(word ^ (ONES * u64::from(b'\\')));
        if found != 0 {
            return Some(from + (found.trailing_zeros() / 8) as usize);
        }
        from += 8;
    }
    bytes
        .get(from..)?
        .iter()
        .position(|&b| b == b'"' || b == b'\\')
        .map(|p| from + p)
}

/// The text that `packed` was packed from ([`pack`]).
pub fn unpack(packed: &str) -> Cow<'_, str> {
    let bytes = packed.as_bytes();
    if bytes.first() == Some(&WHOLE) {
        return Cow::Borrowed(&packed[1..]);
    }
    let Some(first) = bytes.iter().position(|&b| is_mark(b)) else {
        return Cow::Borrowed(packed);
    };
    let mut out = String::with_capacity(packed.len() * 2);
    out.push_str(&packed[..first]);
    let mut i = first;
    while i < bytes.len() {
        let b = bytes[i];
        if is_mark(b) {
            // `pack` writes a mark only before an index of the table.
            let id = usize::from(b - FIRST_MARK) * PER_MARK
                + usize::from(bytes.get(i + 1).copied().unwrap_or(0));
            out.push('"');
            out.push_str(keys::KEYS.get(id).map_or("", |k| k.as_str()));
            out.push_str("\":");
            i += 2;
        } else {
            let run = bytes[i..]
                .iter()
                .position(|&b| is_mark(b))
                .map_or(bytes.len(), |p| i + p);
            out.push_str(&packed[i..run]);
            i = run;
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_gives_the_text_back_byte_for_byte() {
        for text in [
            r#"{"metadata":{"name":"a","uid":"u"},"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#,
            // Spaced out, a key with escapes, a value that looks like a key, keys not in the table.
            "{ \"metadata\" : {\"na\\\"me\":\"x\"}, \"kind\":\"\\\"name\\\":\", \"zzz-unknown\":1}",
            r#"{"status":"metadata","name":"status:","a\\":{"kind":"\\"}}"#,
            r#"["metadata","kind",{"uid":""}]"#,
            "",
            "\"",
            "{\"metadata\":",
            "{\"a\u{1}b\":\"name\":}",
            "\u{0}{\"name\":1}",
            "{\"é\":\"ü\",\"name\":\"ß\"}",
        ] {
            let packed = pack(text);
            assert_eq!(unpack(&packed), text, "{text:?} packed as {packed:?}");
        }
        let text = r#"{"metadata":{"name":"web","labels":{"app":"web"}},"status":{"phase":"Running"}}"#;
        let keys = ["metadata", "name", "labels", "app", "status", "phase"];
        // Each `"key":` in two bytes.
        let saved: usize = keys.iter().map(|k| k.len() + 3 - 2).sum();
        assert_eq!(pack(text).len(), text.len() - saved);
        assert!(matches!(unpack("{\"x-unknown\":1}"), Cow::Borrowed(_)));
    }

    #[test]
    fn the_word_scan_finds_what_a_byte_scan_finds() {
        let text = br#"{"a":"b\"c","metadata":{"name":"x\\"},"d":[1,2,"\u0022"]}  "e"#;
        for start in 0..text.len() {
            for end in start..=text.len() {
                let bytes = &text[start..end];
                for from in 0..=bytes.len() + 1 {
                    let naive = bytes
                        .get(from..)
                        .and_then(|b| b.iter().position(|&b| b == b'"' || b == b'\\'))
                        .map(|p| from + p);
                    assert_eq!(next_special(bytes, from), naive);
                }
            }
        }
    }
}
