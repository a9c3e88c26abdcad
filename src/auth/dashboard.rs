//! envlens' own session (SPEC 9): the dashboard's `envlens_session` cookie, an opaque random
//! id of which the database keeps only the SHA-256 (`db::sessions`). Pages read it through
//! `web::session::Viewer`; the API takes it in [`super::authenticate`] with the same CSRF rule
//! as GitLab's `_gitlab_kas` cookie.

use axum::http::header::COOKIE;
use axum::http::HeaderMap;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::db;
use crate::db::pool::Pool;
use crate::db::sessions::SessionRow;
use crate::error::Error;

/// The dashboard's session cookie.
pub const COOKIE_NAME: &str = "envlens_session";

/// Random bytes behind every secret handed out (session ids, sign-in links, OAuth `state`).
const SECRET_BYTES: usize = 32;
/// Their text: URL-safe base64 without padding.
const SECRET_LEN: usize = 43;

/// A new secret: 256 random bits as URL-safe base64 (cookie-, path- and query-safe).
pub fn new_secret() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; SECRET_BYTES]>())
}

/// What the database keeps of a secret.
pub fn hash(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Whether `text` can be a secret of [`new_secret`]: anything else is not looked up at all.
pub fn is_secret(text: &str) -> bool {
    text.len() == SECRET_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The value of the cookie `name` (without the one pair of quotes RFC 6265 allows).
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| {
            value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value)
        })
}

/// The live session of the request's `envlens_session` cookie; `None` without a cookie, with
/// one that is not a session id, or with an ended or expired session.
pub async fn find(pool: &Pool, headers: &HeaderMap) -> Result<Option<SessionRow>, Error> {
    let Some(id) = cookie(headers, COOKIE_NAME).filter(|v| is_secret(v)) else {
        return Ok(None);
    };
    let mut conn = pool.acquire().await?;
    db::sessions::find_session(&mut *conn, &hash(id)).await
}

/// Whether `sent` is the session's CSRF token, compared in constant time.
pub fn csrf_matches(sent: Option<&str>, expected: &str) -> bool {
    match sent {
        Some(sent) if !expected.is_empty() => {
            bool::from(sent.as_bytes().ct_eq(expected.as_bytes()))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_random_and_recognised() {
        let (a, b) = (new_secret(), new_secret());
        assert_ne!(a, b);
        assert!(is_secret(&a) && is_secret(&b));
        assert!(!is_secret(&a[1..]));
        assert!(!is_secret(&format!("{}=", &a[1..])));
        assert!(!is_secret(""));
        assert_ne!(hash(&a), hash(&b));
    }

    #[test]
    fn cookies_by_name() {
        let mut headers = HeaderMap::new();
        headers.append(COOKIE, "a=1; envlens_session=\"abc\"".parse().unwrap());
        headers.append(COOKIE, "b=2".parse().unwrap());
        assert_eq!(cookie(&headers, COOKIE_NAME), Some("abc"));
        assert_eq!(cookie(&headers, "b"), Some("2"));
        assert_eq!(cookie(&headers, "envlens"), None);
    }

    #[test]
    fn csrf_needs_the_exact_token() {
        assert!(csrf_matches(Some("tok"), "tok"));
        assert!(!csrf_matches(Some("to"), "tok"));
        assert!(!csrf_matches(None, "tok"));
        assert!(!csrf_matches(Some(""), ""));
    }
}
