//! An attempt of "Sign in with GitLab" (SPEC 9, 13), carried by the browser that started it:
//! its `state`, nonce, PKCE verifier and page to return to travel in a cookie signed with an
//! HMAC-SHA256 key derived from the session secret, and expire after [`LIFETIME`]. Nothing is
//! stored on the server before GitLab has answered, so a flood of attempts costs no storage
//! and cannot push out anyone's real one.
//!
//! The verifier is readable by whoever holds the cookie (it is `HttpOnly`, sent to
//! `/-/auth/` only): that is the browser the code comes back to, which PKCE binds the code to.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;
use serde::{Deserialize, Serialize};

/// How long an attempt may take, from the redirect to GitLab to its callback.
pub const LIFETIME: Duration = Duration::from_secs(10 * 60);

/// The longest sealed attempt opened: a browser keeps a cookie of at most 4 KiB.
const MAX_SEALED: usize = 4096;

/// What the key is derived for: no other use of the session secret signs the same bytes.
const PURPOSE: &[u8] = b"envlens sign-in attempt v1";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    #[serde(rename = "s")]
    pub state: String,
    #[serde(rename = "n")]
    pub nonce: String,
    #[serde(rename = "v")]
    pub pkce_verifier: String,
    #[serde(rename = "r")]
    pub return_to: String,
    /// Unix seconds after which the attempt is refused.
    #[serde(rename = "e")]
    pub expires_at: i64,
}

/// Why a sealed attempt is not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsealed {
    /// Not one this server sealed (or altered since).
    Forged,
    Expired,
}

/// The key attempts are sealed with.
pub struct AttemptKey(hmac::Key);

impl AttemptKey {
    /// Derived from the session secret (HMAC of [`PURPOSE`]), so that its tags are no session
    /// token's signature.
    pub fn new(session_secret: &[u8]) -> Self {
        let root = hmac::Key::new(hmac::HMAC_SHA256, session_secret);
        let derived = hmac::sign(&root, PURPOSE);
        AttemptKey(hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()))
    }
}

impl Attempt {
    /// The cookie value: `<payload>.<tag>`, both URL-safe base64.
    pub fn seal(&self, key: &AttemptKey) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let payload = URL_SAFE_NO_PAD.encode(json);
        let tag = hmac::sign(&key.0, payload.as_bytes());
        format!("{payload}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// The attempt `sealed` carries, if this key sealed it and it has not expired at `now`
    /// (Unix seconds). The tag is checked (in constant time) before anything is parsed.
    pub fn open(sealed: &str, key: &AttemptKey, now: i64) -> Result<Attempt, Unsealed> {
        if sealed.len() > MAX_SEALED {
            return Err(Unsealed::Forged);
        }
        let (payload, tag) = sealed.split_once('.').ok_or(Unsealed::Forged)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| Unsealed::Forged)?;
        hmac::verify(&key.0, payload.as_bytes(), &tag).map_err(|_| Unsealed::Forged)?;
        let json = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| Unsealed::Forged)?;
        let attempt: Attempt = serde_json::from_slice(&json).map_err(|_| Unsealed::Forged)?;
        if attempt.expires_at <= now {
            return Err(Unsealed::Expired);
        }
        Ok(attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(expires_at: i64) -> Attempt {
        Attempt {
            state: "s".repeat(43),
            nonce: "n".repeat(43),
            pkce_verifier: "v".repeat(43),
            return_to: "/groups/acme".into(),
            expires_at,
        }
    }

    #[test]
    fn opens_what_it_sealed_until_it_expires() {
        let key = AttemptKey::new(b"session secret");
        let sealed = attempt(1_000).seal(&key);
        assert!(sealed.len() < 400, "{}", sealed.len());
        assert_eq!(Attempt::open(&sealed, &key, 999), Ok(attempt(1_000)));
        assert_eq!(Attempt::open(&sealed, &key, 1_000), Err(Unsealed::Expired));
    }

    #[test]
    fn refuses_another_key_and_any_change() {
        let key = AttemptKey::new(b"session secret");
        let sealed = attempt(1_000).seal(&key);
        let other = AttemptKey::new(b"another secret");
        assert_eq!(Attempt::open(&sealed, &other, 0), Err(Unsealed::Forged));
        // A later expiry, with the old tag.
        let (_, tag) = sealed.split_once('.').unwrap();
        let longer = attempt(9_999).seal(&key);
        let (payload, _) = longer.split_once('.').unwrap();
        let forged = format!("{payload}.{tag}");
        assert_eq!(Attempt::open(&forged, &key, 0), Err(Unsealed::Forged));
        for junk in ["", ".", "abc", "a.b", &"x".repeat(5000)] {
            assert_eq!(
                Attempt::open(junk, &key, 0),
                Err(Unsealed::Forged),
                "{junk}"
            );
        }
    }
}
