//! CI/CD ID tokens (SPEC 12.2): the JWTs a job gets from `id_tokens:` in `.gitlab-ci.yml`,
//! signed by the GitLab instance with the keys it publishes at the `jwks_uri` of its
//! `/.well-known/openid-configuration`.
//!
//! Only RS256 (what GitLab signs with) and ES256 are taken, each only with a key of its own
//! family from GitLab's key set: `alg: none`, HS256 signed with a public key, and every other
//! algorithm are refused before any key is looked at. The key set is cached; an unknown `kid`
//! fetches it again, at most once per [`REFETCH_EVERY`], so that forged tokens cannot make
//! envlens hammer GitLab.
//!
//! The signature is checked with `ring` (the crypto of rustls, already in envlens), against
//! keys read once when the set is fetched, and the set is read without an async lock: an ID
//! token's deployment is to cost about what the internal call of SPEC 4.3 does (BENCHMARKS.md),
//! and RS256 through jsonwebtoken's pure-Rust `rsa` backend, which rebuilds the key from the
//! JWK's numbers for every token, cost several times ring's verification.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::Algorithm;
use ring::signature::{self as ring_signature, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use tokio::sync::Mutex;

use super::api::{ApiError, GitLab};

/// The key set is fetched again for an unknown `kid` at most this often.
pub const REFETCH_EVERY: Duration = Duration::from_secs(30);
/// And in any case after this long, so that a revoked key stops working.
const MAX_AGE: Duration = Duration::from_secs(3600);
/// Clock skew allowed on `exp` and `nbf`, as for the internal tokens (SPEC 2.1).
const LEEWAY_SECONDS: i64 = 5;

/// The claims of an ID token that a deployment needs (GitLab's `id_token_authentication.md`);
/// ids arrive as strings.
#[derive(Debug, Clone, Deserialize)]
pub struct CiJob {
    pub project_id: String,
    pub project_path: String,
    pub job_id: String,
    /// `"true"` or `"false"`: GitLab's answer for the ref, a protected tag's included.
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

/// One of GitLab's public keys, read from its JWK once, with the one algorithm it verifies.
pub struct VerifyingKey {
    alg: Algorithm,
    key: PublicKey,
}

enum PublicKey {
    /// PKCS#1 v1.5 with SHA-256, moduli of 2048 to 8192 bits (GitLab's are 2048 or 4096).
    Rsa(RsaPublicKeyComponents<Vec<u8>>),
    /// P-256, the JWS signature being `r || s`; the key the uncompressed point.
    P256(UnparsedPublicKey<Vec<u8>>),
}

impl VerifyingKey {
    /// The key of a JWK that envlens verifies with: RSA (RS256) and P-256 (ES256). Symmetric
    /// keys and every other kind are `None`: a public key set never verifies HS256.
    pub fn from_jwk(params: &AlgorithmParameters) -> Option<Self> {
        let bytes = |b64: &str| URL_SAFE_NO_PAD.decode(b64.trim_end_matches('=')).ok();
        match params {
            AlgorithmParameters::RSA(rsa) => Some(VerifyingKey {
                alg: Algorithm::RS256,
                key: PublicKey::Rsa(RsaPublicKeyComponents {
                    n: bytes(&rsa.n)?,
                    e: bytes(&rsa.e)?,
                }),
            }),
            AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
                let (x, y) = (bytes(&ec.x)?, bytes(&ec.y)?);
                if x.len() != 32 || y.len() != 32 {
                    return None;
                }
                let point = [&[0x04][..], &x, &y].concat();
                Some(VerifyingKey {
                    alg: Algorithm::ES256,
                    key: PublicKey::P256(UnparsedPublicKey::new(
                        &ring_signature::ECDSA_P256_SHA256_FIXED,
                        point,
                    )),
                })
            }
            _ => None,
        }
    }

    /// Whether `signature` is this key's over `message`.
    fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        match &self.key {
            PublicKey::Rsa(key) => key
                .verify(
                    &ring_signature::RSA_PKCS1_2048_8192_SHA256,
                    message,
                    signature,
                )
                .is_ok(),
            PublicKey::P256(key) => key.verify(message, signature).is_ok(),
        }
    }
}

struct Keys {
    by_kid: HashMap<String, Arc<VerifyingKey>>,
    fetched: Instant,
}

/// Verifies ID tokens against one GitLab instance's keys.
pub struct IdTokens {
    gitlab: GitLab,
    /// `gitlab.url`, as GitLab writes it into `iss`.
    issuer: String,
    /// envlens' public URL, the `aud` a job asks for.
    audience: String,
    /// The set as last fetched, read by every token: held only to clone the `Arc`.
    keys: RwLock<Option<Arc<Keys>>>,
    /// One fetch at a time; tokens that wait for it then read what it brought.
    fetching: Mutex<()>,
    refetch_every: Duration,
}

#[derive(Deserialize)]
struct Discovery {
    jwks_uri: String,
}

/// The registered claims checked on every token (RFC 7519 4.1).
#[derive(Deserialize)]
struct Registered {
    #[serde(default)]
    iss: Option<String>,
    #[serde(default)]
    aud: Option<Audience>,
    #[serde(default)]
    exp: Option<f64>,
    #[serde(default)]
    nbf: Option<f64>,
}

/// `aud`: one audience or several.
#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

impl IdTokens {
    pub fn new(gitlab: GitLab, audience: &str) -> Self {
        IdTokens {
            issuer: gitlab.base().to_owned(),
            audience: audience.trim_end_matches('/').to_owned(),
            gitlab,
            keys: RwLock::new(None),
            fetching: Mutex::new(()),
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
        // `decode_header` read three parts: header.payload.signature.
        let malformed = || Refused::Malformed("not three base64url parts".into());
        let (message, signature) = token.rsplit_once('.').ok_or_else(malformed)?;
        let payload = message.split_once('.').ok_or_else(malformed)?.1;
        let signature = URL_SAFE_NO_PAD.decode(signature).map_err(|_| malformed())?;
        if !key.verifies(message.as_bytes(), &signature) {
            return Err(Refused::Invalid("the signature is not GitLab's".into()));
        }
        let payload = URL_SAFE_NO_PAD.decode(payload).map_err(|_| malformed())?;
        let registered: Registered = serde_json::from_slice(&payload)
            .map_err(|e| Refused::Invalid(format!("its claims: {e}")))?;
        check(
            &registered,
            &self.issuer,
            &self.audience,
            chrono::Utc::now().timestamp(),
        )?;
        serde_json::from_slice(&payload).map_err(|e| Refused::Invalid(format!("its claims: {e}")))
    }

    /// The key `kid` for `alg`, from the cached set or, when it is not there (and the set was
    /// not fetched in the last [`REFETCH_EVERY`]), from GitLab.
    async fn key(&self, kid: &str, alg: Algorithm) -> Result<Arc<VerifyingKey>, Refused> {
        let mut keys = self.cached();
        if self.needs_fetch(keys.as_deref(), kid) {
            let _one = self.fetching.lock().await;
            // Another token's fetch may have brought it meanwhile.
            keys = self.cached();
            if self.needs_fetch(keys.as_deref(), kid) {
                let fetched = Arc::new(self.fetch().await?);
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Some(fetched.clone());
                keys = Some(fetched);
            }
        }
        match keys.as_ref().and_then(|k| k.by_kid.get(kid)) {
            Some(key) if key.alg == alg => Ok(key.clone()),
            _ => Err(Refused::UnknownKey {
                kid: kid.to_owned(),
                alg,
            }),
        }
    }

    fn cached(&self) -> Option<Arc<Keys>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// No set, or one past [`MAX_AGE`], or one without `kid` fetched longer than
    /// [`REFETCH_EVERY`] ago.
    fn needs_fetch(&self, keys: Option<&Keys>, kid: &str) -> bool {
        match keys {
            None => true,
            Some(k) => {
                let age = k.fetched.elapsed();
                age > MAX_AGE || (!k.by_kid.contains_key(kid) && age > self.refetch_every)
            }
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

/// `iss` is GitLab, `aud` envlens (or the OAuth application), `exp` present and not past,
/// `nbf` (when present) past, both within [`LEEWAY_SECONDS`] of `now`.
fn check(claims: &Registered, issuer: &str, audience: &str, now: i64) -> Result<(), Refused> {
    let invalid = |why: &str| Err(Refused::Invalid(why.to_owned()));
    if claims.iss.as_deref() != Some(issuer) {
        return invalid("it was not issued by this GitLab (`iss`)");
    }
    let for_us = match &claims.aud {
        Some(Audience::One(aud)) => aud == audience,
        Some(Audience::Many(auds)) => auds.iter().any(|a| a == audience),
        None => false,
    };
    if !for_us {
        return invalid("it is not for this audience (`aud`)");
    }
    let (now, leeway) = (now as f64, LEEWAY_SECONDS as f64);
    match claims.exp {
        None => return invalid("it has no expiry (`exp`)"),
        Some(exp) if exp + leeway < now => return invalid("it has expired (`exp`)"),
        Some(_) => {}
    }
    if claims.nbf.is_some_and(|nbf| nbf - leeway > now) {
        return invalid("it is not valid yet (`nbf`)");
    }
    Ok(())
}

/// The RSA and P-256 keys of a set, by `kid`, each with the one algorithm it may verify.
/// Symmetric keys and every other kind are left out: a public key set never verifies HS256.
pub fn usable_keys(set: &JwkSet) -> HashMap<String, Arc<VerifyingKey>> {
    set.keys
        .iter()
        .filter_map(|jwk| {
            let kid = jwk.common.key_id.clone()?;
            let key = VerifyingKey::from_jwk(&jwk.algorithm)?;
            Some((kid, Arc::new(key)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISS: &str = "https://gitlab.example.com";
    const AUD: &str = "https://envlens.example.com";

    fn claims(value: serde_json::Value) -> Registered {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn gitlabs_claims_for_this_audience_in_their_time_pass() {
        let now = 1_800_000_000;
        for aud in [serde_json::json!(AUD), serde_json::json!(["other", AUD])] {
            let c =
                claims(serde_json::json!({"iss": ISS, "aud": aud, "exp": now + 60, "nbf": now}));
            assert!(check(&c, ISS, AUD, now).is_ok());
        }
        // Within the leeway on both ends; `nbf` may be absent.
        let c = claims(serde_json::json!({"iss": ISS, "aud": AUD, "exp": now - 5, "nbf": now + 5}));
        assert!(check(&c, ISS, AUD, now).is_ok());
        let c = claims(serde_json::json!({"iss": ISS, "aud": AUD, "exp": now + 1}));
        assert!(check(&c, ISS, AUD, now).is_ok());
    }

    #[test]
    fn any_other_issuer_audience_or_time_is_refused() {
        let now = 1_800_000_000;
        let refused = |v: serde_json::Value, why: &str| {
            let err = check(&claims(v), ISS, AUD, now).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        };
        refused(
            serde_json::json!({"iss": "https://gitlab.evil.example", "aud": AUD, "exp": now + 60}),
            "`iss`",
        );
        refused(serde_json::json!({"aud": AUD, "exp": now + 60}), "`iss`");
        refused(
            serde_json::json!({"iss": ISS, "aud": "https://elsewhere.example", "exp": now + 60}),
            "`aud`",
        );
        refused(
            serde_json::json!({"iss": ISS, "aud": [], "exp": now + 60}),
            "`aud`",
        );
        refused(serde_json::json!({"iss": ISS, "exp": now + 60}), "`aud`");
        refused(serde_json::json!({"iss": ISS, "aud": AUD}), "no expiry");
        refused(
            serde_json::json!({"iss": ISS, "aud": AUD, "exp": now - 6}),
            "expired",
        );
        refused(
            serde_json::json!({"iss": ISS, "aud": AUD, "exp": now + 60, "nbf": now + 6}),
            "not valid yet",
        );
    }
}
