//! The tokens that open a watch-API WebSocket (SPEC 8.3, 16), signed with the internal secret
//! so that any replica can check one (`aud: envlens-watch`: no other token passes for one, nor
//! one for another). Whom a token is for travels in it; that it opens one socket only is
//! recorded in PostgreSQL by its id (`crate::k8s::watch_api::tokens`).

use serde::{Deserialize, Serialize};

use super::{verify_with, Keys, TimeClaims, ISSUER};
use crate::error::Error;

const AUDIENCE: &str = "envlens-watch";

/// What a watch token says: the user, the agent, how the user signed in (which decides the
/// impersonation), its id and its lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchClaims {
    pub jti: String,
    pub agent: i64,
    pub user: i64,
    pub via: super::Via,
    pub iat: i64,
    pub exp: i64,
}

impl TimeClaims for WatchClaims {
    fn iat(&self) -> i64 {
        self.iat
    }
    fn exp(&self) -> i64 {
        self.exp
    }
}

impl WatchClaims {
    /// New claims for `user` on `agent`, valid `ttl_seconds` from now, with a random id.
    pub fn new(agent: i64, user: i64, via: super::Via, ttl_seconds: i64) -> Self {
        let now = chrono::Utc::now().timestamp();
        WatchClaims {
            jti: format!("{:032x}", rand::random::<u128>()),
            agent,
            user,
            via,
            iat: now,
            exp: now + ttl_seconds,
        }
    }
}

impl Keys {
    /// The token for `claims`: a JWT (HS256) of the internal secret, whose characters are all
    /// valid in a WebSocket subprotocol's name.
    pub fn sign_watch_token(&self, claims: &WatchClaims) -> anyhow::Result<String> {
        #[derive(Serialize)]
        struct Signed<'a> {
            iss: &'a str,
            aud: &'a str,
            #[serde(flatten)]
            claims: &'a WatchClaims,
        }
        Ok(jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &Signed {
                iss: ISSUER,
                aud: AUDIENCE,
                claims,
            },
            &jsonwebtoken::EncodingKey::from_secret(self.replica_signer.bytes()),
        )?)
    }

    /// The claims of a token this envlens signed, not expired and living at most
    /// `max_lifetime_seconds` from now.
    pub fn verify_watch_token(
        &self,
        token: &str,
        max_lifetime_seconds: i64,
    ) -> Result<WatchClaims, Error> {
        verify_with(token, &self.internal, AUDIENCE, max_lifetime_seconds, true)
    }

    /// The claims of a token this envlens signed, expired or not: one a replica spent to open
    /// a socket and carries to the owner of its connection, who checks in turn that it was
    /// spent (`crate::db::watch_tokens::was_spent`).
    pub fn verify_spent_watch_token(
        &self,
        token: &str,
        max_lifetime_seconds: i64,
    ) -> Result<WatchClaims, Error> {
        verify_with(token, &self.internal, AUDIENCE, max_lifetime_seconds, false)
    }
}

#[cfg(test)]
mod tests {
    use super::super::secrets::{Secret, Secrets};
    use super::*;

    fn keys(internal: &[u8]) -> Keys {
        Keys::new(Secrets {
            internal: Secret::new(internal.to_vec()),
            session: Secret::new(vec![1; 32]),
            webhook_token: Secret::new(b"hook".to_vec()),
            generated: Vec::new(),
        })
    }

    #[test]
    fn a_token_is_good_wherever_the_secret_is_shared_and_nowhere_else() {
        let one = keys(&[7; 32]);
        let claims = WatchClaims::new(7, 2, super::super::Via::Cookie, 30);
        let token = one.sign_watch_token(&claims).unwrap();
        assert!(token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)));
        assert_eq!(
            keys(&[7; 32]).verify_watch_token(&token, 30).unwrap(),
            claims
        );
        assert!(keys(&[8; 32]).verify_watch_token(&token, 30).is_err());
        // A replica's own token is no watch token, nor the other way round.
        let replica = super::super::mint_replica(&[7; 32], None, "").unwrap();
        assert!(one.verify_watch_token(&replica, 60).is_err());
        let expired = WatchClaims {
            iat: claims.iat - 100,
            exp: claims.iat - 60,
            ..claims.clone()
        };
        let expired = one.sign_watch_token(&expired).unwrap();
        assert!(one.verify_watch_token(&expired, 30).is_err());
        assert!(one.verify_spent_watch_token(&expired, 30).is_ok());
    }
}
