//! Requests from GitLab Rails: a short-lived JWT in `Gitlab-Envlens-Api-Request`.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use serde::Deserialize;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_token_is_accepted_and_short_lived() {
        let key = [7u8; 32];
        let token = mint_internal(&key, std::time::Duration::from_secs(3600)).unwrap();
        let right = jsonwebtoken::DecodingKey::from_secret(&key);
        let claims = verify::<Claims>(&token, &right, AUDIENCE, MAX_LIFETIME_SECONDS);
        let claims = claims.expect("accepted");
        assert_eq!(claims.exp - claims.iat, MAX_LIFETIME_SECONDS);
        let wrong = jsonwebtoken::DecodingKey::from_secret(&[8; 32]);
        assert!(verify::<Claims>(&token, &wrong, AUDIENCE, MAX_LIFETIME_SECONDS).is_err());
    }
}
