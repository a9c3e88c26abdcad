//! Cookies and what a browser sends with them: the `Cookie` header's values (the dashboard's
//! `envlens_session`, GitLab's `_gitlab_kas`), the "Sign in with GitLab" attempt sealed into
//! its cookie (`Attempt::open`), the CSRF token of a form body, and the path a sign-in returns
//! to. The input's first byte picks where it is spliced into an attempt freshly sealed with the
//! fuzz key; the whole input is also the cookie header, the form body and the path. The
//! oracle: no forged or altered attempt opens, a cookie's value is a part of the header, and
//! no return path leads off the site.
#![no_main]

use std::sync::OnceLock;

use axum::http::header::{CONTENT_TYPE, COOKIE};
use axum::http::{HeaderMap, HeaderValue};
use envlens::auth::attempt::{Attempt, AttemptKey};
use envlens::auth::dashboard::{cookie, csrf_matches};
use envlens::web::session::{safe_return_to, sent_csrf};
use libfuzzer_sys::fuzz_target;

const NOW: i64 = 1_800_000_000;

fn sealed() -> &'static (AttemptKey, String) {
    static SEALED: OnceLock<(AttemptKey, String)> = OnceLock::new();
    SEALED.get_or_init(|| {
        let key = AttemptKey::new(b"fuzz session secret");
        let attempt = Attempt {
            state: "s".repeat(43),
            nonce: "n".repeat(43),
            pkce_verifier: "v".repeat(43),
            return_to: "/groups/acme".into(),
            expires_at: NOW + 600,
        };
        let sealed = attempt.seal(&key);
        (key, sealed)
    })
}

fuzz_target!(|input: &[u8]| {
    let (key, real) = sealed();
    let text = String::from_utf8_lossy(input);
    if let Some((&at, rest)) = input.split_first() {
        let rest = String::from_utf8_lossy(rest);
        let candidate = match real.get(..at as usize) {
            Some(head) if (at as usize) < real.len() => format!("{head}{rest}"),
            _ => rest.into_owned(),
        };
        if let Ok(opened) = Attempt::open(&candidate, key, NOW) {
            assert_eq!(&candidate, real, "opened {candidate:?}: {opened:?}");
        }
    }

    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_bytes(input) {
        headers.insert(COOKIE, value);
    }
    for name in ["envlens_session", "_gitlab_kas", ""] {
        if let Some(value) = cookie(&headers, name) {
            assert!(text.contains(value), "{value:?} of {text:?}");
            let _ = csrf_matches(Some(value), "expected");
        }
    }

    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded"),
    );
    let _ = sent_csrf(&headers, input);

    if let Some(path) = safe_return_to(&text) {
        assert!(path.starts_with('/') && !path.starts_with("//") && !path.contains('\\'));
        let url = url::Url::parse("https://envlens.example/")
            .and_then(|base| base.join(path))
            .expect("a path joins");
        assert_eq!(
            url.host_str(),
            Some("envlens.example"),
            "{path:?} left the site"
        );
    }
});
