//! GitLab's own tokens as envlens credentials (SPEC 12.4): a personal, project, group or OAuth
//! access token sent as `Authorization: Bearer` is checked with GitLab (`GET /api/v4/user` with
//! that token), and GitLab's answer is reused for `gitlab.token_cache`. Tokens are kept only
//! as their SHA-256, never as themselves; the cache is bounded.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::api::{ApiError, GitLab, Token};
use crate::telemetry::RequestId;

/// At most this many tokens are remembered; past it the cache starts afresh.
const MAX_ENTRIES: usize = 10_000;

#[derive(Deserialize)]
struct GitLabUser {
    id: i64,
}

/// By a token's SHA-256: when GitLab answered, and the user (`None`: GitLab refused it).
type Answers = HashMap<[u8; 32], (Instant, Option<i64>)>;

/// GitLab's recent answers about the tokens sent to envlens.
pub struct UserTokens {
    ttl: Duration,
    answers: Mutex<Answers>,
}

impl UserTokens {
    pub fn new(ttl: Duration) -> Self {
        UserTokens {
            ttl,
            answers: Mutex::new(HashMap::new()),
        }
    }

    /// The GitLab user whose token this is; `None` when GitLab refuses it. An error when GitLab
    /// cannot be asked: the caller answers 503, never lets the request pass.
    pub async fn user_of(
        &self,
        gitlab: &GitLab,
        token: &str,
        request_id: Option<&RequestId>,
    ) -> Result<Option<i64>, ApiError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some((at, user)) = self.lock().get(&key) {
            if at.elapsed() < self.ttl {
                return Ok(*user);
            }
        }
        let answer = gitlab
            .get_as::<GitLabUser>("/user", "/api/v4/user", &Token::new(token), request_id)
            .await;
        let user = match answer {
            Ok(user) => Some(user.id),
            Err(ApiError::Unauthorized { .. }) => None,
            // 403: a token without `read_user`/`api` scope, or a blocked user.
            Err(ApiError::Status { status, .. }) if status.as_u16() == 403 => None,
            Err(e) => return Err(e),
        };
        let mut answers = self.lock();
        if answers.len() >= MAX_ENTRIES {
            answers.clear();
        }
        answers.insert(key, (Instant::now(), user));
        Ok(user)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Answers> {
        self.answers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether a bearer token is one of envlens' own session JWTs (three base64url parts, a JSON
/// header): anything else is taken for a GitLab token.
pub fn is_jwt(token: &str) -> bool {
    token.starts_with("eyJ") && token.split('.').count() == 3
}
