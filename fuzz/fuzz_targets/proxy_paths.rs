//! The proxy's paths and headers (`/k8s-proxy/*`): the upstream URI envlens builds from the
//! browser's (refusing ambiguous paths), the agent the request names, what Kubernetes'
//! `RequestInfo` makes of the path (the refusals of proxy subresources and of envlens' own
//! Secrets), and the headers forwarded. The input's first line is the path and query after the
//! prefix, each further line a `name: value` header. The oracle: no panic, no forwarded path
//! with a segment that decodes to `.` or `..` or holds an encoded `/`, `\` or NUL, and no
//! credential, hop-by-hop or `Impersonate-*` header forwarded.
#![no_main]

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use envlens::k8s::proxy::{agent_id, request_headers, upstream_uri, PREFIX};
use envlens::k8s::request_info::RequestInfo;
use libfuzzer_sys::fuzz_target;

fn decode(segment: &str) -> Vec<u8> {
    let bytes = segment.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        if let (b'%', Some(Ok(b))) = (bytes[i], hex.map(|h| u8::from_str_radix(h, 16))) {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

fuzz_target!(|input: &[u8]| {
    let text = String::from_utf8_lossy(input);
    let mut lines = text.split('\n');
    let path = lines.next().unwrap_or_default();
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.trim()),
            HeaderValue::from_str(value.trim()),
        ) {
            headers.append(name, value);
        }
    }
    let Ok(uri) = format!("{PREFIX}{path}").parse::<Uri>() else {
        return;
    };
    let _ = agent_id(&headers, &uri);
    if let Some(upstream) = upstream_uri(&uri) {
        let forwarded = upstream.path();
        let rest = forwarded
            .strip_prefix('/')
            .unwrap_or_else(|| panic!("not absolute: {forwarded}"));
        for segment in rest.split('/') {
            let decoded = decode(segment);
            assert!(
                decoded != b"."
                    && decoded != b".."
                    && !decoded.iter().any(|b| matches!(b, b'/' | b'\\' | 0)),
                "{forwarded}"
            );
        }
        if let Some(mut info) = RequestInfo::parse(forwarded) {
            let refusal = info.refusal(Some("envlens"));
            if info.subresource == "proxy" || info.verb_prefix.as_deref() == Some("proxy") {
                assert!(refusal.is_some(), "{forwarded}");
            }
            for method in [Method::GET, Method::DELETE, Method::PATCH] {
                let _ = info.clone().verb(&method, upstream.query());
            }
            let _ = info.verb(&Method::GET, upstream.query());
        }
    }
    let forwarded = request_headers(headers);
    for name in forwarded.keys() {
        let name = name.as_str();
        assert!(
            !matches!(
                name,
                "authorization"
                    | "cookie"
                    | "gitlab-agent-id"
                    | "x-csrf-token"
                    | "connection"
                    | "host"
                    | "content-length"
                    | "proxy-authorization"
            ) && !name.starts_with("impersonate-"),
            "forwarded {name}"
        );
    }
});
