//! CI/CD ID tokens (SPEC 12.2): the JWTs a job gets from `id_tokens:` in `.gitlab-ci.yml`,
//! signed by the GitLab instance with the keys it publishes at the `jwks_uri` of its
//! `/.well-known/openid-configuration`.
//!
//! Only RS256 (what GitLab signs with) and ES256 are taken, each only with a key of its own
//! family from GitLab's key set: `alg: none`, HS256 signed with a public key, and every other
//! algorithm are refused before any key is looked at. The key set is cached; an unknown `kid`
//! fetches it again, at most once per [`REFETCH_EVERY`], so that forged tokens cannot make
//! envlens hammer GitLab.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use tokio::sync::Mutex;

use super::api::{ApiError, GitLab};

/// The key set is fetched again for an unknown `kid` at most this often.
pub const REFETCH_EVERY: Duration = Duration::from_secs(30);
/// And in any case after this long, so that a revoked key stops working.
const MAX_AGE: Duration = Duration::from_secs(3600);
/// Clock skew allowed on `exp` and `nbf`, as for the internal tokens (SPEC 2.1).
const LEEWAY_SECONDS: u64 = 5;

/// The claims of an ID token that a deployment needs (GitLab's `id_token_authentication.md`);
/// ids arrive as strings.
#[derive(Debug, Clone, Deserialize)]
pub struct CiJob {
    pub project_id: String,
    pub project_path: String,
    pub job_id: String,
    /// `"true"` or `"false"`.
    pub ref_protected: String,
    #[serde(default)]
    pub environment: Option<String>,
    #[serde(default)]
    pub deployment_tier: Option<String>,
    #[serde(default)]
    pub user_id: Option<String>,
    #[serde(default, rename = "ref")]
    pub git_ref: Option<String>,
    #[serde(default)]
    pub sha: Option<String>,
    #[serde(default)]
    pub pipeline_id: Option<String>,
}

/// Why a token was refused: every case is a 401 to the caller, the reason in the message.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the token is not a JWT: {0}")]
    Malformed(String),
    #[error("ID tokens are signed with RS256 or ES256, not {0:?}")]
    Algorithm(Algorithm),
    #[error("the token names no key (`kid`)")]
    NoKeyId,
    #[error("GitLab publishes no {alg:?} key `{kid}`")]
    UnknownKey { kid: String, alg: Algorithm },
    #[error("the token is not valid: {0}")]
    Invalid(String),
    /// GitLab's keys could not be had: a 503, not a 401.
    #[error("GitLab's signing keys cannot be read: {0}")]
    Keys(#[from] ApiError),
}

struct Keys {
    by_kid: HashMap<String, (Algorithm, DecodingKey)>,
    fetched: Instant,
}

/// Verifies ID tokens against one GitLab instance's keys.
pub struct IdTokens {
    gitlab: GitLab,
    /// `gitlab.url`, as GitLab writes it into `iss`.
    issuer: String,
    /// envlens' public URL, the `aud` a job asks for.
    audience: String,
    keys: Mutex<Option<Keys>>,
    refetch_every: Duration,
}

#[derive(Deserialize)]
struct Discovery {
    jwks_uri: String,
}

impl IdTokens {
    pub fn new(gitlab: GitLab, audience: &str) -> Self {
        IdTokens {
            issuer: gitlab.base().to_owned(),
            audience: audience.trim_end_matches('/').to_owned(),
            gitlab,
            keys: Mutex::new(None),
            refetch_every: REFETCH_EVERY,
        }
    }

    /// Fetch the key set again for an unknown `kid` at most this often ([`REFETCH_EVERY`]).
    pub fn with_refetch_interval(mut self, every: Duration) -> Self {
        self.refetch_every = every;
        self
    }

    /// The job a valid token was issued for.
    pub async fn verify(&self, token: &str) -> Result<CiJob, Refused> {
        self.verify_as(token).await
    }

    /// The claims of a valid token, as `T`: signed with one of GitLab's keys, issued by it, for
    /// this audience, in its time. The OpenID Connect ID tokens of "Sign in with GitLab" are
    /// checked so, with the OAuth application's id as the audience.
    pub async fn verify_as<T: serde::de::DeserializeOwned>(
        &self,
        token: &str,
    ) -> Result<T, Refused> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| Refused::Malformed(e.to_string()))?;
        if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256) {
            return Err(Refused::Algorithm(header.alg));
        }
        let kid = header.kid.ok_or(Refused::NoKeyId)?;
        let key = self.key(&kid, header.alg).await?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = LEEWAY_SECONDS;
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        jsonwebtoken::decode::<T>(token, &key, &validation)
            .map(|data| data.claims)
            .map_err(|e| Refused::Invalid(e.to_string()))
    }

    /// The key `kid` for `alg`, from the cached set or, when it is not there (and the set was
    /// not fetched in the last [`REFETCH_EVERY`]), from GitLab.
    async fn key(&self, kid: &str, alg: Algorithm) -> Result<DecodingKey, Refused> {
        let mut keys = self.keys.lock().await;
        let stale = keys.as_ref().is_none_or(|k| k.fetched.elapsed() > MAX_AGE);
        let missing = keys.as_ref().is_some_and(|k| !k.by_kid.contains_key(kid))
            && keys
                .as_ref()
                .is_some_and(|k| k.fetched.elapsed() > self.refetch_every);
        if stale || missing {
            *keys = Some(self.fetch().await?);
        }
        let found = keys.as_ref().and_then(|k| k.by_kid.get(kid));
        match found {
            Some((key_alg, key)) if *key_alg == alg => Ok(key.clone()),
            _ => Err(Refused::UnknownKey {
                kid: kid.to_owned(),
                alg,
            }),
        }
    }

    async fn fetch(&self) -> Result<Keys, ApiError> {
        let discovery: Discovery = self
            .gitlab
            .get_public(
                "/.well-known/openid-configuration",
                "/.well-known/openid-configuration",
            )
            .await?;
        let set: JwkSet = self
            .gitlab
            .get_public("jwks_uri", &discovery.jwks_uri)
            .await?;
        Ok(Keys {
            by_kid: usable_keys(&set),
            fetched: Instant::now(),
        })
    }
}

/// The RSA and P-256 keys of a set, by `kid`, each with the one algorithm it may verify.
/// Symmetric keys and every other kind are left out: a public key set never verifies HS256.
pub fn usable_keys(set: &JwkSet) -> HashMap<String, (Algorithm, DecodingKey)> {
    set.keys
        .iter()
        .filter_map(|jwk| {
            let kid = jwk.common.key_id.clone()?;
            let alg = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Algorithm::RS256,
                AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
                    Algorithm::ES256
                }
                _ => return None,
            };
            let key = DecodingKey::from_jwk(jwk).ok()?;
            Some((kid, (alg, key)))
        })
        .collect()
}
