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

/// A token this envlens signed, not expired: whom it was issued to. Not spent yet: the
/// socket spends it ([`Verified::spend`]) once the user's place among their sockets is taken,
/// so that a user refused a socket leaves no row behind.
pub fn verify(keys: &Keys, token: &str) -> Option<Verified> {
    keys.verify_watch_token(token, ttl()).ok().map(Verified)
}

/// A token [`verify`] accepted.
pub struct Verified(WatchClaims);

impl Verified {
    pub fn bound(&self) -> Bound {
        Bound::from(&self.0)
    }

    /// Spends the token: `true` the first time, here or on another replica; an error when the
    /// database cannot record the use (the socket is refused then too).
    pub async fn spend(&self, db: &Pool) -> Result<bool, Error> {
        let mut conn = db.acquire().await?;
        watch_tokens::spend(&mut *conn, &self.0.jti, self.0.exp).await
    }
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
