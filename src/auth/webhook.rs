//! GitLab's hooks: the configured token in `X-Gitlab-Token`, checked before the body is read.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use subtle::ConstantTimeEq;

use super::Keys;
use crate::error::Error;

const TOKEN_HEADER: &str = "x-gitlab-token";

/// Proof that the request carries the webhook token.
#[derive(Debug, Clone, Copy)]
pub struct Webhook;

impl<S: Send + Sync> FromRequestParts<S> for Webhook
where
    Arc<Keys>: FromRef<S>,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        let sent = parts
            .headers
            .get(TOKEN_HEADER)
            .ok_or_else(|| Error::Unauthorized("missing X-Gitlab-Token header".into()))?;
        let keys = Arc::<Keys>::from_ref(state);
        let expected = keys.webhook_token.bytes();
        if bool::from(sent.as_bytes().ct_eq(expected)) {
            Ok(Webhook)
        } else {
            Err(Error::Unauthorized("X-Gitlab-Token does not match".into()))
        }
    }
}
