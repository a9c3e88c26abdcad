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
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    // Where the string being read opened, if in one. Outside strings (as at the start) a quote
    // opens one; inside, a backslash escapes the byte after it. Every byte is looked at once,
    // by the scan or as an escaped byte: a byte that could be taken for a mark sends the text
    // whole.
    let mut open: Option<usize> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if !SPECIAL[usize::from(b)] {
            i += 1;
            continue;
        }
        if is_mark(b) {
            return whole(text);
        }
        match (b, open) {
            (b'"', None) => open = Some(i),
            (b'"', Some(start)) => {
                open = None;
                if bytes.get(i + 1) == Some(&b':') {
                    // A key with escapes is not a name of the table: its text is kept.
                    if let Some(id) = keys::lookup(&text[start + 1..i]) {
                        // Quotes are ASCII: the cuts fall between characters.
                        out.push_str(&text[copied..start]);
                        out.push(char::from(FIRST_MARK + (id / PER_MARK) as u8));
                        out.push(char::from((id % PER_MARK) as u8));
                        copied = i + 2;
                        i = copied;
                        continue;
                    }
                }
            }
            (b'\\', Some(_)) => {
                if bytes.get(i + 1).is_some_and(|&b| is_mark(b)) {
                    return whole(text);
                }
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    out.into_boxed_str()
}

/// The bytes [`pack`] stops at: quotes, backslashes and those that could be taken for a mark.
static SPECIAL: [bool; 256] = {
    let mut special = [false; 256];
    let mut b = 0;
    while b < 256 {
        special[b] = b == b'"' as usize || b == b'\\' as usize || b < (FIRST_MARK as usize + MARKS);
        b += 1;
    }
    special
};

/// `text` kept whole, behind [`WHOLE`].
fn whole(text: &str) -> Box<str> {
    let mut whole = String::with_capacity(text.len() + 1);
    whole.push(char::from(WHOLE));
    whole.push_str(text);
    whole.into_boxed_str()
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
            out.push_str(keys::NAMES.get(id).copied().unwrap_or_default());
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
            "{\"name\":\"\\\u{1}\"}",
            "{\"name\":1}\u{8}",
            "{\"kind\":\"a\",\"\u{2}\":1}",
            "{\"é\":\"ü\",\"name\":\"ß\"}",
        ] {
            let packed = pack(text);
            assert_eq!(unpack(&packed), text, "{text:?} packed as {packed:?}");
        }
        let text =
            r#"{"metadata":{"name":"web","labels":{"app":"web"}},"status":{"phase":"Running"}}"#;
        let keys = ["metadata", "name", "labels", "app", "status", "phase"];
        // Each `"key":` in two bytes.
        let saved: usize = keys.iter().map(|k| k.len() + 3 - 2).sum();
        assert_eq!(pack(text).len(), text.len() - saved);
        assert!(matches!(unpack("{\"x-unknown\":1}"), Cow::Borrowed(_)));
    }

    #[test]
    fn any_text_made_of_the_bytes_that_matter_comes_back() {
        // Texts drawn from quotes, backslashes, colons, marks, names of the table and others.
        let parts = [
            "\"",
            "\\",
            ":",
            "{",
            ",",
            "\u{1}",
            "\u{8}",
            "\u{0}",
            "\t",
            "name",
            "metadata",
            "x",
            "é",
            "\"name\":",
            "\"status\":",
        ];
        let mut seed: u64 = 7;
        for _ in 0..20_000 {
            let mut text = String::new();
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            for _ in 0..(seed >> 60) + 1 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                text.push_str(parts[(seed >> 33) as usize % parts.len()]);
            }
            assert_eq!(unpack(&pack(&text)), text, "{text:?}");
        }
    }
}
