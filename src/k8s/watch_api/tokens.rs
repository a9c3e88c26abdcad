//! The tokens that open a watch WebSocket (SPEC 8.3). A browser cannot set headers on a
//! WebSocket, so GitLab's frontend first asks for a token with its usual credentials and then
//! names the token in a subprotocol. A token is bound to the user, the agent and how the user
//! signed in (which decides the impersonation), lives [`TOKEN_TTL`], and opens one socket.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use sha2::{Digest, Sha256};

use crate::auth::Via;

/// How long a token may wait for its socket: the frontend opens it at once.
pub const TOKEN_TTL: Duration = Duration::from_secs(30);
/// Tokens waiting at once, across users; past it the oldest go first.
pub const MAX_TOKENS: usize = 10_000;

/// Whom a token was issued to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub agent_id: i64,
    pub user_id: i64,
    pub via: Via,
}

/// Tokens issued and not yet used, by their SHA-256 (the tokens themselves are not kept).
pub struct Tokens {
    ttl: Duration,
    max: usize,
    waiting: Mutex<HashMap<[u8; 32], (Instant, Bound)>>,
}

impl Default for Tokens {
    fn default() -> Self {
        Tokens::new(TOKEN_TTL, MAX_TOKENS)
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    pub fn new(ttl: Duration, max: usize) -> Self {
        Tokens {
            ttl,
            max: max.max(1),
            waiting: Mutex::new(HashMap::new()),
        }
    }

    /// A new token for `bound`: 256 random bits, URL-safe base64 (valid in a subprotocol name).
    pub fn issue(&self, bound: Bound) -> String {
        let bytes: [u8; 32] = rand::random();
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let now = Instant::now();
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.retain(|_, (at, _)| now.duration_since(*at) < self.ttl);
        while waiting.len() >= self.max {
            let oldest = waiting
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| *k);
            match oldest {
                Some(k) => waiting.remove(&k),
                None => break,
            };
        }
        waiting.insert(digest(&token), (now, bound));
        token
    }

    /// Whom `token` was issued to, if it is known and fresh; it is spent either way.
    pub fn redeem(&self, token: &str) -> Option<Bound> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let (at, bound) = waiting.remove(&digest(token))?;
        (at.elapsed() < self.ttl).then_some(bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: Bound = Bound {
        agent_id: 7,
        user_id: 2,
        via: Via::Cookie,
    };

    #[test]
    fn a_token_opens_once() {
        let tokens = Tokens::default();
        let t = tokens.issue(ALICE);
        assert!(t.len() >= 43);
        assert!(t
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(tokens.redeem(&t), Some(ALICE));
        assert_eq!(tokens.redeem(&t), None, "a second use");
        assert_eq!(tokens.redeem("made-up"), None);
    }

    #[test]
    fn tokens_expire_and_are_bounded() {
        let tokens = Tokens::new(Duration::from_millis(1), 10);
        let t = tokens.issue(ALICE);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(tokens.redeem(&t), None, "expired");

        let tokens = Tokens::new(Duration::from_secs(60), 2);
        let first = tokens.issue(ALICE);
        std::thread::sleep(Duration::from_millis(2));
        let second = tokens.issue(ALICE);
        let third = tokens.issue(ALICE);
        assert_eq!(tokens.redeem(&first), None, "the oldest made room");
        assert_eq!(tokens.redeem(&second), Some(ALICE));
        assert_eq!(tokens.redeem(&third), Some(ALICE));
    }
}
