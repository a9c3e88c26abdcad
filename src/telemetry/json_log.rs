//! JSON log lines, one object per event, built in one pass into a reused buffer.
//!
//! tracing-subscriber's JSON formatter renders a span's fields to a JSON string when the span
//! opens and again on each `record`, then parses that string back into a map for every event
//! inside the span, and writes each line with a `write` of its own: a request paid for its log
//! line several times over. Here a span's fields are rendered once, each into its own slot
//! (a later `record` of the same field replaces it), and an event copies them into the line.
//!
//! The shape is the formatter's, which operators' pipelines already read:
//! `{"timestamp", "level", "fields": {"message", ...}, "target", "span": {..., "name"}}`, where
//! `span` holds the fields of every span the event is in, the request's outermost, and the name
//! of the innermost.

use std::cell::{Cell, RefCell};
use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use super::log_writer::LogWriter;
use super::request_span::Record as RequestRecord;

/// Writes every event as a JSON line to the [`LogWriter`].
pub struct JsonLayer {
    writer: LogWriter,
}

impl JsonLayer {
    pub fn new(writer: LogWriter) -> Self {
        JsonLayer { writer }
    }
}

/// A span's fields, each rendered once as `"name":value`, by the field's index in its callsite.
struct SpanFields(Vec<Option<String>>);

impl SpanFields {
    fn record(&mut self, values: &dyn RecordFields) {
        values.record(&mut SlotVisitor(self));
    }
}

/// What `Attributes` and `Record` have in common.
trait RecordFields {
    fn record(&self, visitor: &mut dyn Visit);
}

impl RecordFields for Attributes<'_> {
    fn record(&self, visitor: &mut dyn Visit) {
        Attributes::record(self, visitor)
    }
}

impl RecordFields for Record<'_> {
    fn record(&self, visitor: &mut dyn Visit) {
        Record::record(self, visitor)
    }
}

struct SlotVisitor<'a>(&'a mut SpanFields);

impl SlotVisitor<'_> {
    fn slot(&mut self, field: &Field) -> &mut String {
        let slots = &mut self.0 .0;
        let i = field.index();
        if slots.len() <= i {
            slots.resize(i + 1, None);
        }
        let slot = slots[i].get_or_insert_with(String::new);
        slot.clear();
        write_key(slot, field.name());
        slot
    }
}

impl Visit for SlotVisitor<'_> {
    fn record_i64(&mut self, field: &Field, value: i64) {
        write_i64(self.slot(field), value);
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        write_u64(self.slot(field), value);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        write_f64(self.slot(field), value);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        write_bool(self.slot(field), value);
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        write_string(self.slot(field), value);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        write_debug(self.slot(field), value);
    }
}

/// An event's own fields, appended to the line as they come.
struct EventVisitor<'a> {
    out: &'a mut String,
    first: bool,
}

impl EventVisitor<'_> {
    fn key(&mut self, field: &Field) -> &mut String {
        if !std::mem::take(&mut self.first) {
            self.out.push(',');
        }
        write_key(self.out, field.name());
        self.out
    }
}

impl Visit for EventVisitor<'_> {
    fn record_i64(&mut self, field: &Field, value: i64) {
        write_i64(self.key(field), value);
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        write_u64(self.key(field), value);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        write_f64(self.key(field), value);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        write_bool(self.key(field), value);
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        write_string(self.key(field), value);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        write_debug(self.key(field), value);
    }
}

impl<S> Layer<S> for JsonLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = SpanFields(Vec::with_capacity(attrs.metadata().fields().len()));
        fields.record(attrs);
        span.extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(fields) = extensions.get_mut::<SpanFields>() {
            fields.record(values);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        thread_local! {
            static LINE: RefCell<String> = RefCell::new(String::with_capacity(512));
        }
        LINE.with(|line| {
            // A log call while a line is being written (from a field's Debug) gets its own.
            let mut own = String::new();
            let mut borrowed = line.try_borrow_mut();
            let out = match borrowed.as_deref_mut() {
                Ok(line) => line,
                Err(_) => &mut own,
            };
            out.clear();
            self.format(event, &ctx, out);
            self.writer.push(out.as_bytes());
            if out.capacity() > 64 << 10 {
                *out = String::with_capacity(512);
            }
        });
    }
}

impl JsonLayer {
    fn format<S>(&self, event: &Event<'_>, ctx: &Context<'_, S>, out: &mut String)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let meta = event.metadata();
        out.push_str("{\"timestamp\":\"");
        write_timestamp(out, SystemTime::now());
        out.push_str("\",\"level\":\"");
        out.push_str(meta.level().as_str());
        out.push_str("\",\"fields\":{");
        event.record(&mut EventVisitor {
            out: &mut *out,
            first: true,
        });
        out.push_str("},\"target\":");
        write_string(out, meta.target());
        // The request's fields when the task carries them (super::request_span), then those
        // of the spans the event is in.
        let mut open = false;
        super::request_span::with_record(|record| {
            out.push_str(",\"span\":{");
            write_record(out, record);
            open = true;
        });
        let mut leaf = None;
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if !std::mem::replace(&mut open, true) {
                    out.push_str(",\"span\":{");
                }
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<SpanFields>() {
                    for field in fields.0.iter().flatten() {
                        out.push_str(field);
                        out.push(',');
                    }
                }
                leaf = Some(span.name());
            }
        }
        if open {
            out.push_str("\"name\":");
            write_string(out, leaf.unwrap_or("request"));
            out.push('}');
        }
        out.push_str("}\n");
    }
}

/// A line of the layer's shape for what is said outside a tracing event
/// ([`super::logging::announce`]): the message and `fields` as strings, target `envlens`.
pub(super) fn line(level: tracing::Level, message: &str, fields: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(256);
    out.push_str("{\"timestamp\":\"");
    write_timestamp(&mut out, SystemTime::now());
    out.push_str("\",\"level\":\"");
    out.push_str(level.as_str());
    out.push_str("\",\"fields\":{\"message\":");
    write_string(&mut out, message);
    for (name, value) in fields {
        out.push(',');
        write_key(&mut out, name);
        write_string(&mut out, value);
    }
    out.push_str("},\"target\":\"envlens\"}");
    out
}

/// A request's fields (its [`RequestRecord`]), in its span's order, each followed by a comma.
fn write_record(out: &mut String, record: &RequestRecord) {
    out.push_str("\"request_id\":");
    write_string(out, record.request_id());
    out.push_str(",\"method\":");
    write_string(out, record.method.as_str());
    out.push_str(",\"route\":");
    write_string(out, record.route());
    out.push(',');
    if let Some(user_id) = record.user_id.get() {
        write_key(out, "user_id");
        write_i64(out, user_id);
        out.push(',');
    }
    if let Some(agent_id) = record.agent_id.get() {
        write_key(out, "agent_id");
        write_i64(out, agent_id);
        out.push(',');
    }
    if let Some(environment) = record.environment.borrow().as_deref() {
        write_key(out, "environment");
        write_string(out, environment);
        out.push(',');
    }
    if let Some((trace_id, span_id)) = record.trace_ids() {
        write_key(out, "trace_id");
        write_string(out, trace_id);
        out.push(',');
        write_key(out, "span_id");
        write_string(out, span_id);
        out.push(',');
    }
}

fn write_key(out: &mut String, name: &str) {
    write_string(out, name);
    out.push(':');
}

fn write_i64(out: &mut String, value: i64) {
    out.push_str(itoa::Buffer::new().format(value));
}

fn write_u64(out: &mut String, value: u64) {
    out.push_str(itoa::Buffer::new().format(value));
}

/// A JSON number (the shortest that reads back the same, as serde_json writes it); NaN and the
/// infinities, which JSON lacks, as null.
fn write_f64(out: &mut String, value: f64) {
    if value.is_finite() {
        out.push_str(ryu::Buffer::new().format_finite(value));
    } else {
        out.push_str("null");
    }
}

fn write_bool(out: &mut String, value: bool) {
    out.push_str(if value { "true" } else { "false" });
}

/// A JSON string with what must be escaped escaped.
fn write_string(out: &mut String, value: &str) {
    out.push('"');
    Escaped(out).push(value);
    out.push('"');
}

/// A value's `Debug` text as a JSON string, escaped as it is written (no copy).
fn write_debug(out: &mut String, value: &dyn fmt::Debug) {
    out.push('"');
    let _ = write!(Escaped(out), "{value:?}");
    out.push('"');
}

struct Escaped<'a>(&'a mut String);

impl Escaped<'_> {
    fn push(&mut self, s: &str) {
        // Most text (ids, routes, targets, messages) has nothing to escape: copied whole.
        if !needs_escape(s.as_bytes()) {
            self.0.push_str(s);
            return;
        }
        let mut start = 0;
        for (i, b) in s.bytes().enumerate() {
            let escape = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..=0x1f => "",
                _ => continue,
            };
            self.0.push_str(&s[start..i]);
            if escape.is_empty() {
                let _ = write!(self.0, "\\u{b:04x}");
            } else {
                self.0.push_str(escape);
            }
            start = i + 1;
        }
        self.0.push_str(&s[start..]);
    }
}

/// Whether `bytes` holds a control character, `"` or `\\`. Eight bytes at a time (a line's
/// strings are most of its bytes, and nearly all of them have nothing to escape): with `x` a
/// word of eight bytes, `(x - 0x01…·n) & !x & 0x80…` is non-zero exactly when a byte of `x` is
/// below `n` (n ≤ 0x80), and a byte equal to `c` is a zero byte of `x ^ c…`.
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let x = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        if below(x, 0x20)
            | below(x ^ (ONES * u64::from(b'"')), 1)
            | below(x ^ (ONES * u64::from(b'\\')), 1)
            != 0
        {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

impl fmt::Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s);
        Ok(())
    }
}

/// RFC 3339 in UTC with microseconds, e.g. `2026-11-24T11:25:22.123456Z`.
fn write_timestamp(out: &mut String, now: SystemTime) {
    thread_local! {
        /// The last second written and its text: the date and time change once a second, the
        /// lines come by the thousand (the calendar's divisions were half of the timestamp).
        static SECOND: Cell<(u64, [u8; 27])> = const { Cell::new((u64::MAX, [0; 27])) };
    }
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (last, mut text) = SECOND.get();
    if last != secs {
        let (days, rest) = (secs / 86_400, secs % 86_400);
        let (year, month, day) = civil_from_days(days as i64);
        // Digits put in place: `write!` with six padded numbers cost more than a whole line.
        text = *b"0000-00-00T00:00:00.000000Z";
        digits(&mut text[0..4], year.clamp(0, 9999) as u32);
        digits(&mut text[5..7], month);
        digits(&mut text[8..10], day);
        digits(&mut text[11..13], (rest / 3600) as u32);
        digits(&mut text[14..16], (rest / 60 % 60) as u32);
        digits(&mut text[17..19], (rest % 60) as u32);
        SECOND.set((secs, text));
    }
    digits(&mut text[20..26], since.subsec_micros());
    out.push_str(std::str::from_utf8(&text).unwrap_or_default());
}

/// `n`'s last `out.len()` decimal digits, zero-padded.
fn digits(out: &mut [u8], mut n: u32) {
    for c in out.iter_mut().rev() {
        *c = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// The proleptic Gregorian date of a count of days since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{json, Value};
    use tracing_subscriber::layer::SubscriberExt;

    use super::super::log_writer::tests::Captured;
    use super::*;

    /// The lines a layer writes while `f` runs, read back as JSON.
    fn lines_of(f: impl FnOnce()) -> Vec<Value> {
        let out = Captured::default();
        let (writer, mut flusher) = LogWriter::start_with(out.clone());
        let subscriber = tracing_subscriber::registry().with(JsonLayer::new(writer));
        tracing::subscriber::with_default(subscriber, f);
        flusher.close();
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn a_line_carries_the_event_and_the_fields_of_every_span_it_is_in() {
        let lines = lines_of(|| {
            let request = tracing::info_span!(
                "request",
                request_id = %"r-1",
                method = "GET",
                user_id = tracing::field::Empty,
            );
            request.in_scope(|| {
                tracing::Span::current().record("user_id", 7);
                // Recorded again: replaced, not repeated.
                tracing::Span::current().record("user_id", 8);
                tracing::info_span!("inner", step = 2u64).in_scope(|| {
                    tracing::warn!(status = 401, ok = false, ratio = 0.5, "said \"no\"\n");
                });
            });
            tracing::info!(what = ?vec!["a", "b"], "outside");
        });
        assert_eq!(lines.len(), 2, "{lines:?}");
        let line = &lines[0];
        assert_eq!(line["level"], "WARN");
        assert_eq!(
            line["fields"],
            json!({"message": "said \"no\"\n", "status": 401, "ok": false, "ratio": 0.5})
        );
        assert_eq!(line["target"], module_path!());
        assert_eq!(
            line["span"],
            json!({"request_id": "r-1", "method": "GET", "user_id": 8, "step": 2, "name": "inner"})
        );
        let text = line.to_string();
        assert_eq!(text.matches("user_id").count(), 1);
        assert_eq!(lines[1]["fields"]["what"], "[\"a\", \"b\"]");
        assert!(lines[1].get("span").is_none());
    }

    #[test]
    fn a_carried_request_record_is_found_without_a_span() {
        use axum::http::{HeaderValue, Method};

        use super::super::request_span::{carry, Record};

        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let lines = lines_of(|| {
            let record = Record::new(HeaderValue::from_static("r-2"), Method::GET, None);
            runtime.block_on(carry(record, async {
                super::super::record_user(9);
                tokio::task::yield_now().await;
                tracing::info!(status = 200, "request");
                super::super::record_agent(4, Some("prod \"eu\""));
                // A span opened inside: its fields, after the request's.
                tracing::info_span!("inner", step = 1).in_scope(|| tracing::info!("deeper"));
            }));
            tracing::info!("after");
        });
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(
            lines[0]["span"],
            json!({"request_id": "r-2", "method": "GET", "route": "unmatched", "user_id": 9,
                   "name": "request"})
        );
        assert_eq!(
            lines[1]["span"],
            json!({"request_id": "r-2", "method": "GET", "route": "unmatched", "user_id": 9,
                   "agent_id": 4, "environment": "prod \"eu\"", "step": 1, "name": "inner"})
        );
        assert!(lines[2].get("span").is_none());
    }

    #[test]
    fn an_announcement_is_a_line_of_the_same_shape() {
        let line = line(
            tracing::Level::INFO,
            "envlens listening on http://127.0.0.1:8080",
            &[("address", "127.0.0.1:8080"), ("quote", "a \"b\"")],
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(
            v["fields"]["message"],
            "envlens listening on http://127.0.0.1:8080"
        );
        assert_eq!(v["fields"]["address"], "127.0.0.1:8080");
        assert_eq!(v["fields"]["quote"], "a \"b\"");
        assert_eq!(v["target"], "envlens");
        assert!(v["timestamp"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn strings_are_escaped_and_numbers_stay_json() {
        let mut out = String::new();
        write_string(&mut out, "a\"b\\c\u{1}\té");
        assert_eq!(out, r#""a\"b\\c\u0001\té""#);
        let mut out = String::new();
        write_f64(&mut out, f64::NAN);
        assert_eq!(out, "null");
        for (value, text) in [(12.345, "12.345"), (0.5, "0.5"), (3.0, "3.0")] {
            let mut out = String::new();
            write_f64(&mut out, value);
            assert_eq!(out, text);
        }
    }

    #[test]
    fn the_word_at_a_time_check_finds_every_byte_to_escape_at_every_place() {
        let plain = |b: u8| !(b < 0x20 || b == b'"' || b == b'\\');
        for len in [1, 7, 8, 9, 16, 23] {
            for at in 0..len {
                for b in 0..=255u8 {
                    // Around `b`: bytes that border the borrow of the subtraction.
                    for fill in [b'a', 0x7f, 0xff, 0x21, 0x80] {
                        let mut bytes = vec![fill; len];
                        bytes[at] = b;
                        assert_eq!(
                            needs_escape(&bytes),
                            !bytes.iter().all(|&b| plain(b)),
                            "{bytes:?}"
                        );
                    }
                }
            }
        }
        assert!(!needs_escape(b""));
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let mut out = String::new();
        write_timestamp(
            &mut out,
            UNIX_EPOCH + Duration::from_micros(1_795_000_000_123_456),
        );
        assert_eq!(out, "2026-11-18T11:06:40.123456Z");
        let mut out = String::new();
        write_timestamp(&mut out, UNIX_EPOCH + Duration::from_secs(951_782_400));
        assert_eq!(out, "2000-02-29T00:00:00.000000Z");
        // The second's text is kept between lines: the same second again, then the next, then
        // the one before.
        for (micros, text) in [
            (951_782_400_000_007, "2000-02-29T00:00:00.000007Z"),
            (951_782_401_999_999, "2000-02-29T00:00:01.999999Z"),
            (951_782_399_500_000, "2000-02-28T23:59:59.500000Z"),
        ] {
            let mut out = String::new();
            write_timestamp(&mut out, UNIX_EPOCH + Duration::from_micros(micros));
            assert_eq!(out, text);
        }
    }
}
