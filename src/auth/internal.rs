//! Requests from GitLab Rails: a short-lived JWT in `Gitlab-Envlens-Api-Request`.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use serde::Deserialize;

use super::{verify, Keys, TimeClaims};
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
