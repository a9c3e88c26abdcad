//! A signed-in user: GitLab's session JWT as the `_gitlab_kas` cookie (with a CSRF token), or
//! as a bearer token for scripts; or envlens' own dashboard session (`envlens_session`, with
//! the same CSRF rule).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::hs256::Hs256Key;
use axum::extract::{FromRef, FromRequestParts, Query};
use axum::http::header::{AUTHORIZATION, COOKIE, UPGRADE};
use axum::http::request::Parts;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use sqlx::PgExecutor;
use subtle::ConstantTimeEq;

use super::{dashboard, verify, vouched, Keys, TimeClaims, ISSUER, LEEWAY_SECONDS};
use crate::db;
use crate::db::pool::Pool;
use crate::error::Error;
use crate::gitlab::tokens::{admits, is_jwt, CheckError, Checked, Purpose};
use crate::gitlab::Instance;
use crate::http::client_address::ClientAddress;
use crate::telemetry::RequestId;

pub const SESSION_COOKIE: &str = "_gitlab_kas";
pub const CSRF_HEADER: &str = "x-csrf-token";
/// The CSRF token of a WebSocket, which cannot carry custom headers.
const CSRF_QUERY: &str = "gitlab-csrf-token";
const AUDIENCE: &str = "envlens-user";
const MAX_LIFETIME_SECONDS: i64 = 24 * 3600;

#[derive(Debug, Serialize, Deserialize)]
pub struct SessionClaims {
    pub iss: String,
    pub aud: String,
    /// The user id, as a string.
    pub sub: String,
    pub username: String,
    pub csrf: String,
    pub iat: i64,
    pub exp: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
}

impl TimeClaims for SessionClaims {
    fn iat(&self) -> i64 {
        self.iat
    }
    fn exp(&self) -> i64 {
        self.exp
    }
}

/// The signed-in user, as the identity mirror knows them.
#[derive(Debug, Clone)]
pub struct CurrentUser {
    pub id: i64,
    pub username: String,
    pub admin: bool,
    pub via: Via,
}

impl<S: Send + Sync> FromRequestParts<S> for CurrentUser
where
    Arc<Keys>: FromRef<S>,
    Pool: FromRef<S>,
    Option<Arc<Instance>>: FromRef<S>,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        let gitlab = Option::<Arc<Instance>>::from_ref(state);
        let keys = Arc::<Keys>::from_ref(state);
        let session = authenticate(parts, &keys, gitlab.as_deref(), Purpose::Api).await?;
        let mut conn = Pool::from_ref(state).acquire().await?;
        CurrentUser::find(&mut *conn, session).await
    }
}

impl CurrentUser {
    /// The user of a verified session. A user the mirror does not know is treated like a
    /// forged token.
    pub async fn find(db: impl PgExecutor<'_>, session: Session) -> Result<Self, Error> {
        let user = db::identity::find_user(db, session.user_id)
            .await?
            .ok_or_else(|| Error::Unauthorized("unknown user".into()))?;
        Ok(CurrentUser {
            id: user.id,
            username: user.username,
            admin: user.admin,
            via: session.via,
        })
    }
}

/// How the session reached envlens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// A browser's cookie (`_gitlab_kas`, or the dashboard's `envlens_session`), with its CSRF
    /// token.
    Cookie,
    /// `Authorization: Bearer`, for scripts.
    Bearer,
}

/// A verified session token: whose, and how it came. Whether the user still exists is the
/// caller's question (the Kubernetes proxy asks it in the same statement as its others).
#[derive(Debug, Clone, Copy)]
pub struct Session {
    pub user_id: i64,
    pub via: Via,
}

/// The request's session: without an `Authorization` header, the dashboard's live session
/// cookie first; a GitLab token sent as bearer, checked with GitLab when envlens knows one
/// (SPEC 12.4), and taken only with the scopes `purpose` needs (SPEC 13); else GitLab's session
/// token ([`verify_session`]). GitLab unreachable is a 503, never a pass; so is the database,
/// for the dashboard's cookie. With GitLab known, the user's state is read from it again when
/// due (see [`vouched::refresh_state`]).
pub async fn authenticate(
    parts: &Parts,
    keys: &Keys,
    gitlab: Option<&Instance>,
    purpose: Purpose,
) -> Result<Session, Error> {
    let session = credentials(parts, keys, gitlab, purpose).await?;
    if let (Some(gitlab), Some(pool)) = (gitlab, &keys.web_sessions) {
        let request_id = parts.extensions.get::<RequestId>();
        vouched::refresh_state(pool, gitlab, session.user_id, request_id).await;
    }
    Ok(session)
}

async fn credentials(
    parts: &Parts,
    keys: &Keys,
    gitlab: Option<&Instance>,
    purpose: Purpose,
) -> Result<Session, Error> {
    let bearer = parts
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if parts.headers.get(AUTHORIZATION).is_none() {
        if let Some(session) = dashboard_session(parts, keys).await? {
            return Ok(session);
        }
    }
    let Some(token) = bearer.filter(|t| !is_jwt(t)) else {
        return verify_session(parts, keys);
    };
    let Some(gitlab) = gitlab else {
        return Err(Error::Unauthorized(
            "not an envlens token, and envlens knows no GitLab to check it with".into(),
        ));
    };
    let request_id = parts.extensions.get::<RequestId>();
    let client = parts.extensions.get::<ClientAddress>().map(|c| c.0);
    let checked = gitlab
        .user_tokens
        .check(&gitlab.api, token, client, request_id)
        .await;
    let (vouched, fresh) = match checked {
        Ok(Checked::Vouched { token, fresh }) => (token, fresh),
        Ok(Checked::Refused) => {
            return Err(Error::Unauthorized(
                "GitLab does not accept the token".into(),
            ))
        }
        Err(CheckError::Limited(retry_after)) => {
            return Err(Error::TooManyRequests {
                message: "too many unknown tokens from your address: GitLab is asked about                           new ones only so often"
                    .into(),
                retry_after,
            })
        }
        Err(CheckError::Unavailable(e)) => return Err(Error::GitLabUnavailable(e.to_string())),
    };
    admits(&vouched, purpose).map_err(Error::Unauthorized)?;
    if fresh {
        if let Some(pool) = &keys.web_sessions {
            vouched::mirror_token_user(pool, gitlab, token, vouched.user_id, request_id).await?;
        }
    }
    crate::telemetry::record_user(vouched.user_id);
    Ok(Session {
        user_id: vouched.user_id,
        via: Via::Bearer,
    })
}

/// The dashboard's own session (`envlens_session`, SPEC 9), with the CSRF rule of the
/// `_gitlab_kas` cookie. `None` when the request has no such live session, so that a
/// `_gitlab_kas` cookie beside it is still tried.
async fn dashboard_session(parts: &Parts, keys: &Keys) -> Result<Option<Session>, Error> {
    if dashboard::cookie(&parts.headers, dashboard::COOKIE_NAME).is_none() {
        return Ok(None);
    }
    let Some(pool) = &keys.web_sessions else {
        return Ok(None);
    };
    let Some(row) = dashboard::find(pool, &parts.headers).await? else {
        return Ok(None);
    };
    let sent = csrf_token(parts);
    if sent.is_none() {
        return Err(Error::Unauthorized("missing CSRF token".into()));
    }
    if !dashboard::csrf_matches(sent.as_deref(), &row.csrf) {
        return Err(Error::Unauthorized("CSRF token does not match".into()));
    }
    crate::telemetry::record_user(row.user_id);
    Ok(Some(Session {
        user_id: row.user_id,
        via: Via::Cookie,
    }))
}

/// Checks the request's session: bearer first, else the cookie and its CSRF token.
pub fn verify_session(parts: &Parts, keys: &Keys) -> Result<Session, Error> {
    let (token, via) = if let Some(value) = parts.headers.get(AUTHORIZATION) {
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| Error::Unauthorized("Authorization must be `Bearer <token>`".into()))?;
        (token.trim(), Via::Bearer)
    } else {
        let token =
            session_cookie(parts).ok_or_else(|| Error::Unauthorized("not signed in".into()))?;
        (token, Via::Cookie)
    };
    let verified = keys.sessions.verify(token, &keys.session)?;
    if via == Via::Cookie {
        let sent =
            csrf_token(parts).ok_or_else(|| Error::Unauthorized("missing CSRF token".into()))?;
        // An empty claim would match an empty header: a token without one is no cookie session.
        if verified.csrf.is_empty() {
            return Err(Error::Unauthorized("token has no CSRF token".into()));
        }
        if !bool::from(sent.as_bytes().ct_eq(verified.csrf.as_bytes())) {
            return Err(Error::Unauthorized("CSRF token does not match".into()));
        }
    }
    let user_id = verified
        .user_id
        .ok_or_else(|| Error::Unauthorized("token subject is not a user id".into()))?;
    crate::telemetry::record_user(user_id);
    Ok(Session { user_id, via })
}

/// What a request needs of a verified session token.
#[derive(Debug, Clone)]
struct Verified {
    /// `sub` as a user id; `None` when it is not one (the request is then refused).
    user_id: Option<i64>,
    csrf: Arc<str>,
    exp: i64,
    /// When it was verified (Unix seconds).
    at: i64,
}

/// Session tokens verified recently, by their exact text: a page watching resources sends many
/// requests with the same token, and checking its signature and claims each time costs more than
/// the rest of a proxied request's own work.
///
/// Only tokens that verified are kept. Of the checks, only `exp` can turn an accepted token into
/// a refused one as time passes (`iat`, `nbf` and the lifetime bound only get easier), so an entry
/// answers until `exp` plus the leeway has passed, and never if the clock went back since it was
/// verified; otherwise the token is verified again, and refused with verification's own message.
/// A token that differs in any byte is another entry. At `capacity` entries, the expired ones go,
/// and if none had expired, all of them.
pub(super) struct VerifiedSessions {
    capacity: usize,
    entries: Mutex<HashMap<Box<str>, Verified>>,
}

impl VerifiedSessions {
    /// Enough for every signed-in user of a large instance, each token a few hundred bytes.
    pub(super) const CAPACITY: usize = 10_000;

    pub(super) fn new(capacity: usize) -> Self {
        VerifiedSessions {
            capacity,
            entries: Mutex::default(),
        }
    }

    /// The token's claims, from the cache or verified now (and then cached).
    fn verify(&self, token: &str, key: &Hs256Key) -> Result<Verified, Error> {
        let now = chrono::Utc::now().timestamp();
        if let Some(verified) = self.get(token, now) {
            return Ok(verified);
        }
        let claims: SessionClaims = verify(token, key, AUDIENCE, MAX_LIFETIME_SECONDS)?;
        let verified = Verified {
            user_id: claims.sub.parse().ok(),
            csrf: claims.csrf.into(),
            exp: claims.exp,
            at: now,
        };
        self.insert(token, verified.clone(), now);
        Ok(verified)
    }

    fn get(&self, token: &str, now: i64) -> Option<Verified> {
        let entries = self.lock();
        let verified = entries.get(token)?;
        (verified.at <= now && now <= verified.exp + LEEWAY_SECONDS as i64)
            .then(|| verified.clone())
    }

    fn insert(&self, token: &str, verified: Verified, now: i64) {
        let mut entries = self.lock();
        if entries.len() >= self.capacity && !entries.contains_key(token) {
            entries.retain(|_, v| v.at <= now && now <= v.exp + LEEWAY_SECONDS as i64);
            if entries.len() >= self.capacity {
                entries.clear();
            }
        }
        entries.insert(token.into(), verified);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Verified>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn session_cookie(parts: &Parts) -> Option<&str> {
    parts
        .headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| unquote(value))
}

/// A cookie value without the one pair of quotes RFC 6265 allows around it; any other quote
/// stays, and the value is then no token.
fn unquote(value: &str) -> &str {
    value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value)
}

/// `X-Csrf-Token`, or for a WebSocket upgrade the `gitlab-csrf-token` query parameter.
pub(super) fn csrf_token(parts: &Parts) -> Option<String> {
    if let Some(v) = parts.headers.get(CSRF_HEADER) {
        return v.to_str().ok().map(str::to_owned);
    }
    let websocket = parts
        .headers
        .get(UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if !websocket {
        return None;
    }
    let Query(query) = Query::<HashMap<String, String>>::try_from_uri(&parts.uri).ok()?;
    query.get(CSRF_QUERY).cloned()
}

/// Mints a session token as GitLab would, for `envlens token` and for tests.
/// Returns the token and its CSRF value.
pub fn mint_session(
    key: &[u8],
    user_id: i64,
    username: &str,
    ttl: std::time::Duration,
) -> anyhow::Result<(String, String)> {
    let now = chrono::Utc::now().timestamp();
    let csrf = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 24]>());
    let claims = SessionClaims {
        iss: ISSUER.into(),
        aud: AUDIENCE.into(),
        sub: user_id.to_string(),
        username: username.into(),
        csrf: csrf.clone(),
        iat: now,
        exp: now + ttl.as_secs().min(MAX_LIFETIME_SECONDS as u64) as i64,
        nbf: None,
    };
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(key),
    )?;
    Ok((token, csrf))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::http::Request;

    use super::*;
    use crate::auth::secrets::{Secret, Secrets};

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn keys() -> Keys {
        Keys::new(Secrets {
            internal: Secret::new(b"internal-key-internal-key-intern".to_vec()),
            session: Secret::new(KEY.to_vec()),
            webhook_token: Secret::new(b"hook".to_vec()),
            generated: Vec::new(),
        })
    }

    fn token(user_id: i64) -> String {
        mint_session(KEY, user_id, "alice", Duration::from_secs(600))
            .unwrap()
            .0
    }

    fn parts(header: (&str, &str), csrf: Option<&str>) -> Parts {
        let mut request = Request::get("/k8s-proxy/api").header(header.0, header.1);
        if let Some(csrf) = csrf {
            request = request.header(CSRF_HEADER, csrf);
        }
        request.body(()).unwrap().into_parts().0
    }

    fn bearer(token: &str) -> Parts {
        parts(("authorization", &format!("Bearer {token}")), None)
    }

    fn cached(keys: &Keys) -> usize {
        keys.sessions.lock().len()
    }

    #[test]
    fn a_cached_token_answers_only_until_it_expires() {
        let cache = VerifiedSessions::new(10);
        let key = Hs256Key::new(KEY);
        let token = token(7);
        let first = cache.verify(&token, &key).unwrap();
        assert_eq!(first.user_id, Some(7));
        let (at, exp) = (first.at, first.exp);
        assert!(cache.get(&token, at).is_some());
        // As verification does: accepted until `exp` plus the leeway, refused after.
        assert!(cache.get(&token, exp + LEEWAY_SECONDS as i64).is_some());
        assert!(cache.get(&token, exp + LEEWAY_SECONDS as i64 + 1).is_none());
        // A clock that went back since is not trusted with `iat` and `nbf`.
        assert!(cache.get(&token, at - 1).is_none());
    }

    #[test]
    fn another_token_is_verified_on_its_own() {
        let keys = keys();
        let good = token(7);
        assert_eq!(verify_session(&bearer(&good), &keys).unwrap().user_id, 7);
        assert_eq!(verify_session(&bearer(&good), &keys).unwrap().user_id, 7);
        assert_eq!(cached(&keys), 1);
        // The same claims under another signature.
        let (head_and_claims, signature) = good.rsplit_once('.').unwrap();
        let flipped = if signature.starts_with('A') { 'B' } else { 'A' };
        let forged = format!("{head_and_claims}.{flipped}{}", &signature[1..]);
        assert!(verify_session(&bearer(&forged), &keys).is_err());
        let other_key = mint_session(&[7; 32], 7, "alice", Duration::from_secs(600))
            .unwrap()
            .0;
        assert!(verify_session(&bearer(&other_key), &keys).is_err());
        assert_eq!(cached(&keys), 1);
        // Another user's token is their own entry.
        assert_eq!(
            verify_session(&bearer(&token(8)), &keys).unwrap().user_id,
            8
        );
        assert_eq!(cached(&keys), 2);
    }

    #[test]
    fn a_cached_cookie_still_needs_its_csrf_token() {
        let keys = keys();
        let (token, csrf) = mint_session(KEY, 7, "alice", Duration::from_secs(600)).unwrap();
        let cookie = format!("_gitlab_kas={token}");
        let session = verify_session(&parts(("cookie", &cookie), Some(&csrf)), &keys).unwrap();
        assert_eq!((session.user_id, session.via), (7, Via::Cookie));
        assert_eq!(cached(&keys), 1);
        for (sent, why) in [
            (None, "missing CSRF token"),
            (Some("x"), "CSRF token does not match"),
        ] {
            match verify_session(&parts(("cookie", &cookie), sent), &keys) {
                Err(Error::Unauthorized(message)) => assert_eq!(message, why),
                other => panic!("{other:?}"),
            }
        }
    }

    /// Found by the fuzzer (tests/fuzz.rs): quotes were trimmed however many there were.
    #[test]
    fn a_cookie_may_be_quoted_once_only() {
        let keys = keys();
        let (token, csrf) = mint_session(KEY, 7, "alice", Duration::from_secs(600)).unwrap();
        for (cookie, accepted) in [
            (format!("_gitlab_kas={token}"), true),
            (format!("_gitlab_kas=\"{token}\""), true),
            (format!("_gitlab_kas=\"\"\"{token}"), false),
            (format!("_gitlab_kas=\"{token}"), false),
            (format!("_gitlab_kas=\"\"{token}\"\""), false),
        ] {
            let parts = parts(("cookie", &cookie), Some(&csrf));
            assert_eq!(verify_session(&parts, &keys).is_ok(), accepted, "{cookie}");
        }
    }

    #[test]
    fn the_cache_stays_within_its_capacity() {
        let cache = VerifiedSessions::new(3);
        let key = Hs256Key::new(KEY);
        for user in 1..=10 {
            let token = token(user);
            cache.verify(&token, &key).unwrap();
            assert!(cache.lock().len() <= 3);
            assert!(cache.lock().contains_key(token.as_str()));
        }
        // Full: the expired entries go first, the others stay.
        let cache = VerifiedSessions::new(2);
        let entry = |exp| Verified {
            user_id: Some(1),
            csrf: "c".into(),
            exp,
            at: 0,
        };
        cache.insert("long", entry(1000), 0);
        cache.insert("short", entry(10), 0);
        cache.insert("new", entry(1000), 100);
        let mut kept: Vec<String> = cache.lock().keys().map(|k| k.to_string()).collect();
        kept.sort();
        assert_eq!(kept, ["long", "new"]);
    }
}
