//! Requests from GitLab Rails: a short-lived JWT in `Gitlab-Envlens-Api-Request`.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::Method;
use bytes::Bytes;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{verify, Keys, TimeClaims, ISSUER};
use crate::error::Error;

pub const INTERNAL_HEADER: &str = "gitlab-envlens-api-request";
const AUDIENCE: &str = "envlens";
/// GitLab signs each request; a token may live five minutes at most.
const MAX_LIFETIME_SECONDS: i64 = 5 * 60;

#[derive(Deserialize)]
struct Claims {
    iat: i64,
    exp: i64,
}

impl TimeClaims for Claims {
    fn iat(&self) -> i64 {
        self.iat
    }
    fn exp(&self) -> i64 {
        self.exp
    }
}

/// Proof that the request was signed by GitLab with the internal secret.
#[derive(Debug, Clone, Copy)]
pub struct Internal;

impl<S: Send + Sync> FromRequestParts<S> for Internal
where
    Arc<Keys>: FromRef<S>,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        let keys = Arc::<Keys>::from_ref(state);
        let token = parts
            .headers
            .get(INTERNAL_HEADER)
            .ok_or_else(|| Error::Unauthorized("missing Gitlab-Envlens-Api-Request header".into()))?
            .to_str()
            .map_err(|_| Error::Unauthorized("token is malformed".into()))?;
        verify::<Claims>(token, &keys.internal, AUDIENCE, MAX_LIFETIME_SECONDS)?;
        Ok(Internal)
    }
}

/// Mints an internal token as GitLab would, for `envlens token --internal` (trying the
/// internal API with `curl`). It lives at most five minutes, as GitLab's do.
pub fn mint_internal(key: &[u8], ttl: std::time::Duration) -> anyhow::Result<String> {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        iss: &'a str,
        aud: &'a str,
        iat: i64,
        exp: i64,
    }
    let now = chrono::Utc::now().timestamp();
    let claims = Claims {
        iss: ISSUER,
        aud: AUDIENCE,
        iat: now,
        exp: now + ttl.as_secs().min(MAX_LIFETIME_SECONDS as u64) as i64,
    };
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(key),
    )?)
}

/// The header a replica signs its requests to another with (SPEC 16).
pub const REPLICA_HEADER: &str = "envlens-replica-request";
/// Tokens between replicas are for replicas only: GitLab's internal tokens (`aud: envlens`)
/// are refused there, and these are refused on GitLab's internal API.
const REPLICA_AUDIENCE: &str = "envlens-replica";
/// A replica signs each request just before sending it. The owner refuses a token that
/// expires later than this from its own clock; the sender signs for half of it, so that a
/// sender's clock ahead of the owner's by up to 30 s is not taken for a forgery (the request
/// would silently be read here instead of through the owner).
const REPLICA_LIFETIME_SECONDS: i64 = 60;

#[derive(serde::Serialize, Deserialize)]
struct ReplicaClaims {
    iat: i64,
    exp: i64,
    /// The viewer's own credential (their session token or cookie value), for the owner to
    /// authenticate afresh: never a claim of who the viewer is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    credential: Option<String>,
    /// The request the token is for ([`replica_request`]): a token taken off one request
    /// cannot carry another ask, or go to another route, in its lifetime.
    #[serde(default)]
    request: String,
}

impl TimeClaims for ReplicaClaims {
    fn iat(&self) -> i64 {
        self.iat
    }
    fn exp(&self) -> i64 {
        self.exp
    }
}

/// What a replica's token binds it to: the SHA-256 of its request's method, path and body, in
/// hex.
pub fn replica_request(method: &Method, path: &str, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(method.as_str());
    hash.update(b" ");
    hash.update(path);
    hash.update(b"\n");
    hash.update(body);
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Signs a request to another replica with the internal secret, carrying `credential`, for
/// the request `request` names ([`replica_request`]).
pub fn mint_replica(key: &[u8], credential: Option<&str>, request: &str) -> anyhow::Result<String> {
    #[derive(serde::Serialize)]
    struct Signed<'a> {
        iss: &'a str,
        aud: &'a str,
        #[serde(flatten)]
        claims: ReplicaClaims,
    }
    let now = chrono::Utc::now().timestamp();
    let signed = Signed {
        iss: ISSUER,
        aud: REPLICA_AUDIENCE,
        claims: ReplicaClaims {
            iat: now,
            exp: now + REPLICA_LIFETIME_SECONDS / 2,
            credential: credential.map(str::to_owned),
            request: request.to_owned(),
        },
    };
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &signed,
        &jsonwebtoken::EncodingKey::from_secret(key),
    )?)
}

/// A request signed by another replica of this envlens, for this very request (its method,
/// path and body), and the viewer's credential it carries; with its body, read here (within
/// the listener's bound on a body) to check it.
#[derive(Debug, Clone)]
pub struct FromReplica {
    pub credential: Option<String>,
    pub body: Bytes,
}

impl<S: Send + Sync> FromRequest<S> for FromReplica
where
    Arc<Keys>: FromRef<S>,
{
    type Rejection = Error;

    async fn from_request(request: Request, state: &S) -> Result<Self, Error> {
        let keys = Arc::<Keys>::from_ref(state);
        let (parts, body) = request.into_parts();
        let claims = {
            let token = parts
                .headers
                .get(REPLICA_HEADER)
                .ok_or_else(|| {
                    Error::Unauthorized("missing Envlens-Replica-Request header".into())
                })?
                .to_str()
                .map_err(|_| Error::Unauthorized("token is malformed".into()))?;
            verify::<ReplicaClaims>(
                token,
                &keys.internal,
                REPLICA_AUDIENCE,
                REPLICA_LIFETIME_SECONDS,
            )?
        };
        let (method, path) = (parts.method.clone(), parts.uri.path().to_owned());
        let body = Bytes::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(|e| Error::BadRequest(format!("the request's body: {e}")))?;
        if claims.request != replica_request(&method, &path, &body) {
            return Err(Error::Unauthorized(
                "the token was signed for another request".into(),
            ));
        }
        Ok(FromReplica {
            credential: claims.credential,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::hs256::Hs256Key;
    use super::*;

    #[test]
    fn replicas_and_gitlab_do_not_accept_each_others_tokens() {
        let key = [7u8; 32];
        let right = Hs256Key::new(&key);
        let token = mint_replica(&key, Some("viewer-token"), "r").unwrap();
        let claims = verify::<ReplicaClaims>(&token, &right, REPLICA_AUDIENCE, 60).unwrap();
        assert_eq!(claims.credential.as_deref(), Some("viewer-token"));
        assert!(verify::<Claims>(&token, &right, AUDIENCE, MAX_LIFETIME_SECONDS).is_err());
        let gitlab = mint_internal(&key, std::time::Duration::from_secs(60)).unwrap();
        assert!(verify::<ReplicaClaims>(&gitlab, &right, REPLICA_AUDIENCE, 60).is_err());
        let wrong = Hs256Key::new(&[8; 32]);
        assert!(verify::<ReplicaClaims>(&token, &wrong, REPLICA_AUDIENCE, 60).is_err());
    }

    #[test]
    fn a_minted_token_is_accepted_and_short_lived() {
        let key = [7u8; 32];
        let token = mint_internal(&key, std::time::Duration::from_secs(3600)).unwrap();
        let right = Hs256Key::new(&key);
        let claims = verify::<Claims>(&token, &right, AUDIENCE, MAX_LIFETIME_SECONDS);
        let claims = claims.expect("accepted");
        assert_eq!(claims.exp - claims.iat, MAX_LIFETIME_SECONDS);
        let wrong = Hs256Key::new(&[8; 32]);
        assert!(verify::<Claims>(&token, &wrong, AUDIENCE, MAX_LIFETIME_SECONDS).is_err());
    }
}
