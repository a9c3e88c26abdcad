//! GitLab's own tokens as envlens credentials (SPEC 12.4 and 13): a personal, project, group or
//! OAuth access token sent as `Authorization: Bearer` is checked with GitLab, and GitLab's answer
//! is reused for `gitlab.token_cache`.
//!
//! - An access token is read with `GET /api/v4/personal_access_tokens/self` (`user_id`,
//!   `active`, `scopes`). GitLab's API takes OAuth tokens wherever it takes access tokens, so
//!   a token GitLab does not know is a 401 there, and an OAuth token some other answer (not an
//!   access token's): only then is `GET /oauth/token/info` asked (`resource_owner_id`,
//!   `scope`, `application.uid`). A token GitLab does not know therefore costs one call.
//! - Refusals are remembered for [`REFUSED_FOR`] (a negative cache): a token GitLab refused
//!   costs it one call a minute at most, however often it is sent.
//! - A token not in either cache makes a call only within its client address' budget
//!   ([`budget`]): a flood of random tokens from one address is answered 429 without asking.
//! - Tokens are kept only as their SHA-256, never as themselves; both caches are bounded, and
//!   refusals cannot push out the tokens GitLab vouched for.
//!
//! What each use needs of a token is [`scopes`]' decision.

pub mod budget;
pub mod scopes;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::api::{ApiError, GitLab, Token};
use crate::telemetry::RequestId;
pub use scopes::{admits, Purpose, TokenKind, Vouched};

/// At most this many tokens are remembered in each cache.
const MAX_ENTRIES: usize = 10_000;
/// How long GitLab's refusal of a token holds.
pub const REFUSED_FOR: Duration = Duration::from_secs(60);

/// `GET /personal_access_tokens/self`, as far as envlens reads it.
#[derive(Deserialize)]
struct AccessTokenSelf {
    user_id: i64,
    scopes: Vec<String>,
    #[serde(default)]
    active: Option<bool>,
    #[serde(default)]
    revoked: Option<bool>,
}

/// `GET /oauth/token/info` (Doorkeeper's), as far as envlens reads it.
#[derive(Deserialize)]
struct OAuthTokenInfo {
    resource_owner_id: Option<i64>,
    #[serde(default)]
    scope: Option<Vec<String>>,
    /// The deprecated alias of `scope`, which older GitLabs send alone.
    #[serde(default)]
    scopes: Option<Vec<String>>,
    #[serde(default)]
    application: Option<Application>,
}

#[derive(Deserialize)]
struct Application {
    uid: Option<String>,
}

/// GitLab's word on a token.
#[derive(Debug, Clone)]
pub enum Checked {
    /// GitLab vouches for it; `fresh` when it was asked just now (not from the cache).
    Vouched { token: Arc<Vouched>, fresh: bool },
    /// GitLab refuses it (unknown, revoked, expired, inactive).
    Refused,
}

/// Why a token could not be checked: never a pass.
#[derive(Debug)]
pub enum CheckError {
    /// GitLab cannot be asked now (a 503).
    Unavailable(ApiError),
    /// The client address has asked about too many new tokens: try again after this long.
    Limited(Duration),
}

type Key = [u8; 32];

/// GitLab's recent answers about the tokens sent to envlens, and the budget of new ones.
pub struct UserTokens {
    ttl: Duration,
    /// envlens' own OAuth application (`gitlab.client_id`), whose tokens pass every use.
    own_client_id: Option<String>,
    vouched: Mutex<HashMap<Key, (Instant, Arc<Vouched>)>>,
    refused: Mutex<HashMap<Key, Instant>>,
    budget: budget::Budget,
}

impl UserTokens {
    pub fn new(ttl: Duration, own_client_id: Option<String>) -> Self {
        UserTokens {
            ttl,
            own_client_id,
            vouched: Mutex::default(),
            refused: Mutex::default(),
            budget: budget::Budget::default(),
        }
    }

    /// GitLab's answer about `token`, from the caches or asked now within the budget of the
    /// client's address.
    pub async fn check(
        &self,
        gitlab: &GitLab,
        token: &str,
        client: Option<IpAddr>,
        request_id: Option<&RequestId>,
    ) -> Result<Checked, CheckError> {
        let key: Key = Sha256::digest(token.as_bytes()).into();
        if let Some((at, vouched)) = lock(&self.vouched).get(&key) {
            if at.elapsed() < self.ttl {
                return Ok(Checked::Vouched {
                    token: vouched.clone(),
                    fresh: false,
                });
            }
        }
        if let Some(at) = lock(&self.refused).get(&key) {
            if at.elapsed() < REFUSED_FOR {
                return Ok(Checked::Refused);
            }
        }
        self.budget.take(client).map_err(CheckError::Limited)?;
        let answer = self
            .ask(gitlab, &Token::new(token), request_id)
            .await
            .map_err(CheckError::Unavailable)?;
        let now = Instant::now();
        Ok(match answer {
            Some(vouched) => {
                let vouched = Arc::new(vouched);
                insert(&self.vouched, key, (now, vouched.clone()), |(at, _)| {
                    at.elapsed() < self.ttl
                });
                Checked::Vouched {
                    token: vouched,
                    fresh: true,
                }
            }
            None => {
                insert(&self.refused, key, now, |at| at.elapsed() < REFUSED_FOR);
                Checked::Refused
            }
        })
    }

    /// GitLab's answer: `None` when it refuses the token.
    async fn ask(
        &self,
        gitlab: &GitLab,
        token: &Token,
        request_id: Option<&RequestId>,
    ) -> Result<Option<Vouched>, ApiError> {
        let answer = gitlab
            .get_as::<Value>(
                "/personal_access_tokens/self",
                "/api/v4/personal_access_tokens/self",
                token,
                request_id,
            )
            .await;
        match answer {
            Ok(body) => {
                if let Ok(own) = serde_json::from_value::<AccessTokenSelf>(body) {
                    let live = own.active.unwrap_or(false) && !own.revoked.unwrap_or(false);
                    return Ok(live.then_some(Vouched {
                        user_id: own.user_id,
                        kind: TokenKind::AccessToken,
                        scopes: own.scopes,
                    }));
                }
            }
            Err(ApiError::Unauthorized { .. }) => return Ok(None),
            Err(ApiError::Status { status, .. }) if is_refusal(status) => {}
            Err(e) => return Err(e),
        }
        // A token GitLab took that is not an access token: an OAuth token's information.
        let info = gitlab
            .get_as::<OAuthTokenInfo>("/oauth/token/info", "/oauth/token/info", token, request_id)
            .await;
        match info {
            Ok(info) => {
                let Some(user_id) = info.resource_owner_id else {
                    // An application's own token (client credentials) is no user's.
                    return Ok(None);
                };
                let issued_to = info.application.and_then(|a| a.uid);
                let own_application =
                    self.own_client_id.is_some() && issued_to == self.own_client_id;
                Ok(Some(Vouched {
                    user_id,
                    kind: TokenKind::OAuth { own_application },
                    scopes: info.scope.or(info.scopes).unwrap_or_default(),
                }))
            }
            Err(ApiError::Unauthorized { .. }) => Ok(None),
            Err(ApiError::Status { status, .. }) if is_refusal(status) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A 4xx but 429 (which is GitLab's own limit: not a refusal of the token).
fn is_refusal(status: StatusCode) -> bool {
    status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Inserts into a bounded cache: when full, the stale entries go, and if none was, all.
fn insert<V>(cache: &Mutex<HashMap<Key, V>>, key: Key, value: V, fresh: impl Fn(&V) -> bool) {
    let mut entries = lock(cache);
    if entries.len() >= MAX_ENTRIES && !entries.contains_key(&key) {
        entries.retain(|_, v| fresh(v));
        if entries.len() >= MAX_ENTRIES {
            entries.clear();
        }
    }
    entries.insert(key, value);
}

/// Whether a bearer token is one of envlens' own session JWTs (three base64url parts, a JSON
/// header): anything else is taken for a GitLab token.
pub fn is_jwt(token: &str) -> bool {
    token.starts_with("eyJ") && token.split('.').count() == 3
}
