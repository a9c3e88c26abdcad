//! The three kinds of callers (SPEC section 2), as extractors that routes only declare:
//! [`Internal`] for GitLab Rails, [`CurrentUser`] for a signed-in user, [`Webhook`] for
//! GitLab's hooks.

pub mod attempt;
mod credential;
pub mod dashboard;
mod hs256;
mod internal;
pub mod recheck;
pub mod secrets;
mod session;
pub mod vouched;
pub mod watch_token;
mod webhook;

use serde::de::DeserializeOwned;

pub use credential::Credential;
pub use internal::{
    mint_internal, mint_replica, replica_request, FromReplica, Internal, INTERNAL_HEADER,
    REPLICA_HEADER,
};
pub use session::{
    authenticate, mint_session, verify_session, CurrentUser, Session, SessionClaims, Via,
    CSRF_HEADER, SESSION_COOKIE,
};
pub use webhook::{GroupToken, Webhook};

use crate::db::pool::Pool;
use crate::error::Error;
use hs256::{Expected, Hs256Key};
use secrets::{Secret, Secrets};

/// Every token is issued by GitLab.
const ISSUER: &str = "gitlab";
/// Clock skew tolerated between GitLab and envlens.
const LEEWAY_SECONDS: u64 = 5;

/// The keys that check each kind of caller.
pub struct Keys {
    internal: Hs256Key,
    /// The internal secret itself, which signs this replica's requests to the others.
    replica_signer: Secret,
    session: Hs256Key,
    /// Session tokens that `session` verified recently.
    sessions: session::VerifiedSessions,
    webhook_token: Secret,
    /// Group webhooks' tokens, each vouching only for its group (`webhook`).
    group_webhooks: Vec<webhook::GroupToken>,
    /// Where the dashboard's sessions are looked up (`envlens_session`), and users GitLab
    /// vouches for are added; none until the state attaches its pool, and then the cookie is
    /// not taken.
    web_sessions: Option<Pool>,
    /// Seals the "Sign in with GitLab" attempts that browsers carry ([`attempt`]).
    attempts: attempt::AttemptKey,
}

impl Keys {
    pub fn new(secrets: Secrets) -> Self {
        Keys {
            internal: Hs256Key::new(secrets.internal.bytes()),
            replica_signer: Secret::new(secrets.internal.bytes().to_vec()),
            session: Hs256Key::new(secrets.session.bytes()),
            sessions: session::VerifiedSessions::new(session::VerifiedSessions::CAPACITY),
            webhook_token: secrets.webhook_token,
            group_webhooks: Vec::new(),
            web_sessions: None,
            attempts: attempt::AttemptKey::new(secrets.session.bytes()),
        }
    }

    /// Signs a request to another replica (SPEC 16), carrying the viewer's `credential`, for
    /// the request `request` names ([`replica_request`]).
    pub fn sign_for_replica(
        &self,
        credential: Option<&Credential>,
        request: &str,
    ) -> anyhow::Result<String> {
        mint_replica(
            self.replica_signer.bytes(),
            credential.map(Credential::encode).as_deref(),
            request,
        )
    }

    /// The key of the sign-in attempts' cookies.
    pub fn attempts(&self) -> &attempt::AttemptKey {
        &self.attempts
    }

    /// Takes the dashboard's session cookie too, looked up in `pool`.
    pub fn with_web_sessions(mut self, pool: Pool) -> Self {
        self.web_sessions = Some(pool);
        self
    }
}

/// The time claims every token carries.
trait TimeClaims {
    fn iat(&self) -> i64;
    fn exp(&self) -> i64;
}

/// Verifies an HS256 token for `audience`: signature, `iss`, `aud`, `exp` (no further ahead
/// than `max_lifetime_seconds`, without leeway), `iat` (not in the future) and `nbf` when
/// present.
fn verify<C: DeserializeOwned + TimeClaims>(
    token: &str,
    key: &Hs256Key,
    audience: &str,
    max_lifetime_seconds: i64,
) -> Result<C, Error> {
    verify_with(token, key, audience, max_lifetime_seconds, true)
}

/// [`verify`], with `exp` itself checked or not (`check_exp`: a spent watch token carried
/// from another replica's socket outlives its expiry, [`watch_token`]); the cap on how far
/// ahead it lies always is.
fn verify_with<C: DeserializeOwned + TimeClaims>(
    token: &str,
    key: &Hs256Key,
    audience: &str,
    max_lifetime_seconds: i64,
    check_exp: bool,
) -> Result<C, Error> {
    let now = chrono::Utc::now().timestamp();
    let leeway = LEEWAY_SECONDS as i64;
    // Pinned to HS256: `alg: none` and every other algorithm fail the header check.
    let expected = Expected {
        issuer: ISSUER,
        audience,
        check_exp,
        leeway,
        now,
    };
    let claims: C = hs256::decode(token, key, &expected)
        .map_err(|refusal| Error::Unauthorized(refusal.message().into()))?;
    if claims.iat() > now + leeway {
        return Err(Error::Unauthorized("token is issued in the future".into()));
    }
    // The cap is a cap: the leeway is for clocks that differ on whether a token is still
    // (or already) valid, not a longer life.
    if claims.exp() > now + max_lifetime_seconds {
        return Err(Error::Unauthorized(
            "token expires too far in the future".into(),
        ));
    }
    Ok(claims)
}
