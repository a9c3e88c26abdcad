//! The id of a request, as GitLab's components name it (`X-Request-Id`, GitLab's correlation
//! id), carried on to the cluster as Kubernetes' `Audit-ID` so that the API server's audit log
//! names the same id, and the W3C trace context that goes with it.

use std::fmt;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");
/// Kubernetes' header for the id the API server writes into its audit events.
pub const AUDIT_ID_HEADER: HeaderName = HeaderName::from_static("audit-id");
pub const TRACEPARENT_HEADER: HeaderName = HeaderName::from_static("traceparent");

/// At most this long, as SPEC 7 says: enough for GitLab's ids (26-character ULIDs) and UUIDs.
const MAX_LEN: usize = 128;

/// A request's id: the caller's well-formed `X-Request-Id`, or a new one. It is a header value
/// and a log field, so it is restricted to `[A-Za-z0-9._-]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId {
    id: HeaderValue,
    /// The caller's `traceparent`, passed on as it came when no tracer is installed.
    traceparent: Option<HeaderValue>,
}

impl RequestId {
    /// The id the caller sent when it is well formed, else a new random one.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let id = headers
            .get(&REQUEST_ID_HEADER)
            .filter(|v| well_formed(v.as_bytes()))
            .cloned()
            .unwrap_or_else(new_id);
        let traceparent = headers
            .get(&TRACEPARENT_HEADER)
            .filter(|v| valid_traceparent(v.as_bytes()))
            .cloned();
        RequestId { id, traceparent }
    }

    pub fn as_str(&self) -> &str {
        // Only ever built from checked ASCII.
        self.id.to_str().unwrap_or_default()
    }

    pub fn header_value(&self) -> HeaderValue {
        self.id.clone()
    }

    /// The caller's trace context, when it sent a valid one.
    pub fn traceparent(&self) -> Option<&HeaderValue> {
        self.traceparent.as_ref()
    }

    /// The trace id and the caller's span id of its `traceparent`, when it sent a valid one
    /// (`00-<trace id>-<span id>-<flags>`, checked when it was read).
    pub fn trace_ids(&self) -> Option<(&str, &str)> {
        trace_ids(self.traceparent.as_ref()?)
    }

    /// The headers every call out of this request carries: `Audit-ID` for a Kubernetes API
    /// server, `X-Request-Id` for GitLab, and `traceparent`: the current span's when traces
    /// are exported, else the caller's own, passed on unchanged.
    pub fn outgoing_headers(&self, headers: &mut HeaderMap) {
        headers.insert(AUDIT_ID_HEADER, self.id.clone());
        headers.insert(REQUEST_ID_HEADER, self.id.clone());
        let context = tracing::Span::current().context();
        TraceContextPropagator::new()
            .inject_context(&context, &mut opentelemetry_http::HeaderInjector(headers));
        if !headers.contains_key(&TRACEPARENT_HEADER) {
            if let Some(traceparent) = &self.traceparent {
                headers.insert(TRACEPARENT_HEADER, traceparent.clone());
            }
        }
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn well_formed(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `version-traceid-parentid-flags` of W3C Trace Context, version `00`, ids not all zero.
/// The trace id and span id of a `traceparent` that [`valid_traceparent`] accepted.
pub(super) fn trace_ids(traceparent: &HeaderValue) -> Option<(&str, &str)> {
    let text = traceparent.to_str().ok()?;
    Some((text.get(3..35)?, text.get(36..52)?))
}

fn valid_traceparent(value: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(value) else {
        return false;
    };
    let parts: Vec<&str> = text.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    parts.len() == 4
        && parts[0] == "00"
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
        && parts[1].bytes().any(|b| b != b'0')
        && parts[2].bytes().any(|b| b != b'0')
}

/// 26 characters of Crockford base32 over 128 random bits: the shape of GitLab's own ids.
fn new_id() -> HeaderValue {
    const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let mut bits: u128 = rand::random();
    let mut id = [0u8; 26];
    for c in id.iter_mut().rev() {
        *c = ALPHABET[(bits & 31) as usize];
        bits >>= 5;
    }
    HeaderValue::from_bytes(&id).expect("ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_well_formed_id_is_kept_and_anything_else_replaced() {
        let kept = RequestId::from_headers(&headers(&[("x-request-id", "01HXYZ.abc_def-1")]));
        assert_eq!(kept.as_str(), "01HXYZ.abc_def-1");
        for bad in ["has space", "semi;colon", "é", &"a".repeat(129)] {
            let id = RequestId::from_headers(&headers(&[("x-request-id", bad)]));
            assert_ne!(id.as_str(), bad);
            assert_eq!(id.as_str().len(), 26, "{bad}");
        }
        let a = RequestId::from_headers(&HeaderMap::new());
        let b = RequestId::from_headers(&HeaderMap::new());
        assert_ne!(a, b);
        assert!(well_formed(a.as_str().as_bytes()));
    }

    #[test]
    fn trace_ids_are_read_from_the_traceparent() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let id = RequestId::from_headers(&headers(&[("traceparent", good)]));
        assert_eq!(
            id.trace_ids(),
            Some(("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"))
        );
        assert_eq!(RequestId::from_headers(&headers(&[])).trace_ids(), None);
    }

    #[test]
    fn traceparent_is_checked_and_passed_on() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let id =
            RequestId::from_headers(&headers(&[("traceparent", good), ("x-request-id", "r1")]));
        let mut out = HeaderMap::new();
        id.outgoing_headers(&mut out);
        assert_eq!(out["audit-id"], "r1");
        assert_eq!(out["x-request-id"], "r1");
        assert_eq!(out["traceparent"], good);
        for bad in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            let id = RequestId::from_headers(&headers(&[("traceparent", bad)]));
            assert!(id.traceparent().is_none(), "{bad}");
        }
    }
}
