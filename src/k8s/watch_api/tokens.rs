//! The tokens that open a watch WebSocket (SPEC 8.3). A browser cannot set headers on a
//! WebSocket, so GitLab's frontend first asks for a token with its usual credentials and then
//! names the token in a subprotocol. A token is bound to the user, the agent and how the user
//! signed in (which decides the impersonation), lives [`TOKEN_TTL`], and opens one socket.
//!
//! Replicas (SPEC 16): a token is signed with the internal secret ([`WatchClaims`]), so that
//! the replica the socket reaches need not be the one that issued it, and its one use is
//! recorded in PostgreSQL ([`crate::db::watch_tokens`]), so that it opens one socket across
//! all of them. A replica whose socket's watches are answered by the owner of the connection
//! carries the spent token there as the viewer's credential ([`spent`]).

use std::time::Duration;

use crate::auth::watch_token::WatchClaims;
use crate::auth::{Keys, Via};
use crate::db::pool::Pool;
use crate::db::watch_tokens;
use crate::error::Error;

/// How long a token may wait for its socket: the frontend opens it at once.
pub const TOKEN_TTL: Duration = Duration::from_secs(30);

/// Whom a token was issued to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub agent_id: i64,
    pub user_id: i64,
    pub via: Via,
}

impl From<&WatchClaims> for Bound {
    fn from(claims: &WatchClaims) -> Self {
        Bound {
            agent_id: claims.agent,
            user_id: claims.user,
            via: claims.via,
        }
    }
}

fn ttl() -> i64 {
    TOKEN_TTL.as_secs() as i64
}

/// A new token for `bound`.
pub fn issue(keys: &Keys, bound: Bound) -> anyhow::Result<String> {
    keys.sign_watch_token(&WatchClaims::new(
        bound.agent_id,
        bound.user_id,
        bound.via,
        ttl(),
    ))
}

/// Whom `token` was issued to, if this envlens signed it, it has not expired and it was never
/// used, here or on another replica: it is spent now. `Ok(None)` for a token refused; an error
/// when the database cannot record the use (the socket is refused then too).
pub async fn redeem(keys: &Keys, db: &Pool, token: &str) -> Result<Option<Bound>, Error> {
    let Ok(claims) = keys.verify_watch_token(token, ttl()) else {
        return Ok(None);
    };
    let mut conn = db.acquire().await?;
    let first = watch_tokens::spend(&mut *conn, &claims.jti, claims.exp).await?;
    Ok(first.then(|| Bound::from(&claims)))
}

/// Whom `token` was issued to, when it is one this envlens signed and some replica spent on a
/// socket (whatever its age within [`watch_tokens::KEPT_HOURS`]): what the owner of a
/// connection checks of a socket's watches another replica hands it.
pub async fn spent(keys: &Keys, db: &Pool, token: &str) -> Result<Bound, Error> {
    let claims = keys.verify_spent_watch_token(token, ttl())?;
    let kept = watch_tokens::KEPT_HOURS * 3600 + ttl();
    if claims.iat < chrono::Utc::now().timestamp() - kept {
        return Err(Error::Unauthorized("the watch token is too old".into()));
    }
    let mut conn = db.acquire().await?;
    if !watch_tokens::was_spent(&mut *conn, &claims.jti).await? {
        return Err(Error::Unauthorized(
            "the watch token opened no socket".into(),
        ));
    }
    Ok(Bound::from(&claims))
}
