//! A signed-in user: GitLab's session JWT as the `_gitlab_kas` cookie (with a CSRF token), or
//! as a bearer token for scripts.

use std::collections::HashMap;

use axum::extract::{FromRequestParts, Query};
use axum::http::header::{AUTHORIZATION, COOKIE, UPGRADE};
use axum::http::request::Parts;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use sqlx::PgExecutor;
use subtle::ConstantTimeEq;

use super::{verify, Keys, TimeClaims, ISSUER};
use crate::db;
use crate::error::Error;
use crate::state::AppState;

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

impl FromRequestParts<AppState> for CurrentUser {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let session = verify_session(parts, &state.keys)?;
        CurrentUser::find(&state.db, session).await
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The browser's `_gitlab_kas` cookie, with its CSRF token.
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

/// Checks the request's session: bearer first, else the cookie and its CSRF token.
pub fn verify_session(parts: &Parts, keys: &Keys) -> Result<Session, Error> {
    let (claims, via) = if let Some(value) = parts.headers.get(AUTHORIZATION) {
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| Error::Unauthorized("Authorization must be `Bearer <token>`".into()))?;
        let claims: SessionClaims =
            verify(token.trim(), &keys.session, AUDIENCE, MAX_LIFETIME_SECONDS)?;
        (claims, Via::Bearer)
    } else {
        let token =
            session_cookie(parts).ok_or_else(|| Error::Unauthorized("not signed in".into()))?;
        let claims: SessionClaims = verify(token, &keys.session, AUDIENCE, MAX_LIFETIME_SECONDS)?;
        let sent =
            csrf_token(parts).ok_or_else(|| Error::Unauthorized("missing CSRF token".into()))?;
        if !bool::from(sent.as_bytes().ct_eq(claims.csrf.as_bytes())) {
            return Err(Error::Unauthorized("CSRF token does not match".into()));
        }
        (claims, Via::Cookie)
    };
    let user_id = claims
        .sub
        .parse()
        .map_err(|_| Error::Unauthorized("token subject is not a user id".into()))?;
    Ok(Session { user_id, via })
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
        .map(|(_, value)| value.trim_matches('"'))
}

/// `X-Csrf-Token`, or for a WebSocket upgrade the `gitlab-csrf-token` query parameter.
fn csrf_token(parts: &Parts) -> Option<String> {
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
