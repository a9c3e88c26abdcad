//! HS256 tokens (GitLab's internal requests, the replicas' and the watch tokens, the sessions),
//! checked against an HMAC key built once per secret.
//!
//! jsonwebtoken's `decode` rebuilt the HMAC key for every token, decoded the header twice and
//! the claims twice, through generic claim sets: 42k instructions of an internal deployment
//! creation's 275k (BENCHMARKS.md, "Deployment creation"). The checks are jsonwebtoken's, in
//! its order, with the same outcome for every token: the header names HS256 (`alg: none` and
//! every other algorithm refused before the signature), the signature (compared in constant
//! time), then the claims: `exp`, `iss` and `aud` present, `exp` and `nbf` against the clock
//! with the leeway, `iss` and `aud` among the expected ones (a string, or an array naming
//! one). [`verify`](super::verify) adds the cap on the lifetime and `iat`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Deserialize;
use std::borrow::Cow;

/// An HS256 secret, its HMAC state computed once.
pub struct Hs256Key(hmac::Key);

impl Hs256Key {
    pub fn new(secret: &[u8]) -> Self {
        Hs256Key(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }
}

/// Why a token is refused, each answered 401 with its words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Malformed,
    Algorithm,
    Signature,
    MissingClaim,
    Expired,
    Immature,
    Issuer,
    Audience,
}

impl Refusal {
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Expired => "token has expired",
            Refusal::Immature => "token is not valid yet",
            Refusal::Signature => "token signature does not match",
            Refusal::Audience => "token is not meant for this audience",
            Refusal::Issuer => "token is not issued by gitlab",
            Refusal::Algorithm => "token must be signed with HS256",
            Refusal::MissingClaim => "token lacks a required claim",
            Refusal::Malformed => "token is malformed",
        }
    }
}

/// What the token must say besides its signature.
pub struct Expected<'a> {
    pub issuer: &'a str,
    pub audience: &'a str,
    /// Whether `exp` is checked against the clock (it must be present in any case).
    pub check_exp: bool,
    pub leeway: i64,
    /// Seconds since the epoch.
    pub now: i64,
}

/// The algorithms JWS names (RFC 7518) that jsonwebtoken knows: a token signed with one of
/// them is refused for its algorithm; any other `alg` (`none` among them) is malformed.
const OTHER_ALGORITHMS: [&str; 11] = [
    "HS384", "HS512", "ES256", "ES384", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
    "EdDSA",
];

#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    alg: Cow<'a, str>,
}

/// The registered claims that are checked, each `None` when absent or of another type.
#[derive(Deserialize)]
struct Registered<'a> {
    #[serde(default, deserialize_with = "lenient")]
    exp: Option<Numeric>,
    #[serde(default, deserialize_with = "lenient")]
    nbf: Option<Numeric>,
    #[serde(default, borrow, deserialize_with = "lenient")]
    iss: Option<Names<'a>>,
    #[serde(default, borrow, deserialize_with = "lenient")]
    aud: Option<Names<'a>>,
}

/// A time claim: a non-negative integer, or a number rounded to one.
#[derive(Clone, Copy)]
enum Numeric {
    Parsed(u64),
    Invalid,
}

impl<'de> Deserialize<'de> for Numeric {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Number {
            U(u64),
            F(f64),
            Other(IgnoredAny),
        }
        Ok(match Number::deserialize(d)? {
            Number::U(n) => Numeric::Parsed(n),
            Number::F(f) if f.is_finite() && f >= 0.0 && f < u64::MAX as f64 => {
                Numeric::Parsed(f.round() as u64)
            }
            _ => Numeric::Invalid,
        })
    }
}

/// `iss` or `aud`: one name or several.
#[derive(Deserialize)]
#[serde(untagged)]
enum Names<'a> {
    One(#[serde(borrow)] Cow<'a, str>),
    Many(#[serde(borrow)] Vec<Cow<'a, str>>),
}

impl Names<'_> {
    fn contains(&self, name: &str) -> bool {
        match self {
            Names::One(one) => one == name,
            Names::Many(many) => many.iter().any(|n| n == name),
        }
    }
}

/// A claim of the wrong type counts as absent, as `null` does.
fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Maybe<T> {
        Value(T),
        Other(IgnoredAny),
    }
    Ok(match Option::<Maybe<T>>::deserialize(d)? {
        Some(Maybe::Value(v)) => Some(v),
        _ => None,
    })
}

/// The claims of a token signed with `key`, as `C`, once the header, the signature and the
/// registered claims passed.
pub fn decode<C: DeserializeOwned>(
    token: &str,
    key: &Hs256Key,
    expected: &Expected<'_>,
) -> Result<C, Refusal> {
    let (message, signature) = token.rsplit_once('.').ok_or(Refusal::Malformed)?;
    let (header, payload) = message.rsplit_once('.').ok_or(Refusal::Malformed)?;
    let header = base64(header)?;
    let header: Header = serde_json::from_slice(&header).map_err(|_| Refusal::Malformed)?;
    if header.alg != "HS256" {
        return Err(if OTHER_ALGORITHMS.contains(&&*header.alg) {
            Refusal::Algorithm
        } else {
            Refusal::Malformed
        });
    }
    let signature = base64(signature)?;
    hmac::verify(&key.0, message.as_bytes(), &signature).map_err(|_| Refusal::Signature)?;
    let payload = base64(payload)?;
    let claims: C = serde_json::from_slice(&payload).map_err(|_| Refusal::Malformed)?;
    // A claims set is a JSON object (RFC 7519, 4); serde would read [`Registered`] from an
    // array too, by position.
    if payload.trim_ascii_start().first() != Some(&b'{') {
        return Err(Refusal::Malformed);
    }
    let registered: Registered =
        serde_json::from_slice(&payload).map_err(|_| Refusal::Malformed)?;
    check(&registered, expected)?;
    Ok(claims)
}

fn base64(part: &str) -> Result<Vec<u8>, Refusal> {
    URL_SAFE_NO_PAD.decode(part).map_err(|_| Refusal::Malformed)
}

fn check(claims: &Registered<'_>, expected: &Expected<'_>) -> Result<(), Refusal> {
    let exp = match claims.exp {
        Some(Numeric::Parsed(exp)) => exp,
        _ => return Err(Refusal::MissingClaim),
    };
    let (Some(iss), Some(aud)) = (&claims.iss, &claims.aud) else {
        return Err(Refusal::MissingClaim);
    };
    let now = expected.now.max(0) as u64;
    let leeway = expected.leeway.max(0) as u64;
    if let Some(Numeric::Invalid) = claims.nbf {
        return Err(Refusal::Malformed);
    }
    if expected.check_exp && exp < now.saturating_sub(leeway) {
        return Err(Refusal::Expired);
    }
    if let Some(Numeric::Parsed(nbf)) = claims.nbf {
        if nbf > now + leeway {
            return Err(Refusal::Immature);
        }
    }
    if !iss.contains(expected.issuer) {
        return Err(Refusal::Issuer);
    }
    if !aud.contains(expected.audience) {
        return Err(Refusal::Audience);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header as JwtHeader, Validation};
    use serde_json::{json, Value};

    const KEY: &[u8] = b"an-internal-secret-of-32-bytes!!";
    const NOW: i64 = 1_800_000_000;

    /// jsonwebtoken's answer for `token`, as envlens checked tokens before this module.
    fn jsonwebtoken_says(token: &str, check_exp: bool) -> Result<Value, Refusal> {
        use jsonwebtoken::errors::ErrorKind;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.validate_exp = check_exp;
        validation.leeway = 5;
        validation.validate_nbf = true;
        validation.set_issuer(&["gitlab"]);
        validation.set_audience(&["envlens"]);
        validation.set_required_spec_claims(&["exp", "iat", "iss", "aud"]);
        jsonwebtoken::decode::<Value>(token, &DecodingKey::from_secret(KEY), &validation)
            .map(|t| t.claims)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => Refusal::Expired,
                ErrorKind::ImmatureSignature => Refusal::Immature,
                ErrorKind::InvalidSignature => Refusal::Signature,
                ErrorKind::InvalidAudience => Refusal::Audience,
                ErrorKind::InvalidIssuer => Refusal::Issuer,
                ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => Refusal::Algorithm,
                ErrorKind::MissingRequiredClaim(_) => Refusal::MissingClaim,
                _ => Refusal::Malformed,
            })
    }

    fn sign(claims: &Value, alg: Algorithm, key: &[u8]) -> String {
        let key = match alg {
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => EncodingKey::from_secret(key),
            _ => unreachable!(),
        };
        jsonwebtoken::encode(&JwtHeader::new(alg), claims, &key).unwrap()
    }

    fn b64(s: &str) -> String {
        URL_SAFE_NO_PAD.encode(s)
    }

    /// A token with a header and claims written by hand, signed with `KEY`.
    fn raw(header: &str, claims: &str) -> String {
        let message = format!("{}.{}", b64(header), b64(claims));
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, KEY), message.as_bytes());
        format!("{message}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// Every case gets jsonwebtoken's answer: a valid token its claims, every other the same
    /// refusal. Times are around the real clock, which jsonwebtoken reads.
    #[test]
    fn answers_as_jsonwebtoken_did() {
        let now = chrono::Utc::now().timestamp();
        let good = json!({"iss": "gitlab", "aud": "envlens", "iat": now, "exp": now + 60});
        let with = |patch: Value| {
            let mut claims = good.clone();
            for (k, v) in patch.as_object().unwrap() {
                if v.is_null() {
                    claims.as_object_mut().unwrap().remove(k);
                } else {
                    claims[k] = v.clone();
                }
            }
            claims
        };
        let hs = |claims: Value| sign(&claims, Algorithm::HS256, KEY);
        let mut cases: Vec<(&str, String)> = vec![
            ("good", hs(good.clone())),
            (
                "aud among several",
                hs(with(json!({"aud": ["x", "envlens"]}))),
            ),
            (
                "iss among several",
                hs(with(json!({"iss": ["gitlab", "y"]}))),
            ),
            (
                "aud not among several",
                hs(with(json!({"aud": ["x", "y"]}))),
            ),
            ("aud empty", hs(with(json!({"aud": []})))),
            (
                "exp a float",
                hs(with(json!({"exp": (now + 60) as f64 + 0.4}))),
            ),
            ("exp negative", hs(with(json!({"exp": -1})))),
            ("exp a string", hs(with(json!({"exp": "soon"})))),
            ("exp within the leeway", hs(with(json!({"exp": now - 2})))),
            ("expired", hs(with(json!({"exp": now - 30})))),
            ("nbf ahead", hs(with(json!({"nbf": now + 120})))),
            ("nbf within the leeway", hs(with(json!({"nbf": now + 2})))),
            ("nbf a string", hs(with(json!({"nbf": "later"})))),
            ("wrong aud", hs(with(json!({"aud": "envlens-user"})))),
            ("wrong iss", hs(with(json!({"iss": "gitlab-evil"})))),
            ("aud a number", hs(with(json!({"aud": 5})))),
            ("no aud", hs(with(json!({"aud": null})))),
            ("no iss", hs(with(json!({"iss": null})))),
            ("no exp", hs(with(json!({"exp": null})))),
            (
                "other secret",
                sign(&good, Algorithm::HS256, b"another-key-another-key-another-"),
            ),
            ("HS512", sign(&good, Algorithm::HS512, KEY)),
            ("HS384", sign(&good, Algorithm::HS384, KEY)),
            (
                "alg none",
                format!("{}.{}.", b64(r#"{"alg":"none"}"#), b64(&good.to_string())),
            ),
            (
                "alg RS256",
                raw(r#"{"alg":"RS256","typ":"JWT"}"#, &good.to_string()),
            ),
            ("alg unknown", raw(r#"{"alg":"HS257"}"#, &good.to_string())),
            ("no alg", raw(r#"{"typ":"JWT"}"#, &good.to_string())),
            ("header not JSON", raw("{", &good.to_string())),
            ("claims not JSON", raw(r#"{"alg":"HS256"}"#, "{")),
            ("claims not an object", raw(r#"{"alg":"HS256"}"#, "[1]")),
            ("garbage", "not-a-jwt".to_owned()),
            ("two parts", "a.b".to_owned()),
            ("four parts", format!("x.{}", hs(good.clone()))),
            ("empty", String::new()),
        ];
        let good_token = hs(good.clone());
        let mut tampered = good_token.clone();
        tampered.push('A');
        cases.push(("signature tampered", tampered));
        let mut bad_b64 = good_token.clone();
        bad_b64.push('!');
        cases.push(("signature not base64url", bad_b64));
        for check_exp in [true, false] {
            for (case, token) in &cases {
                let expected = Expected {
                    issuer: "gitlab",
                    audience: "envlens",
                    check_exp,
                    leeway: 5,
                    now,
                };
                let ours = decode::<Value>(token, &Hs256Key::new(KEY), &expected);
                assert_eq!(
                    ours,
                    jsonwebtoken_says(token, check_exp),
                    "{case}, exp checked: {check_exp}"
                );
            }
        }
        // The clock is the caller's: a token good now has expired an hour later.
        let later = Expected {
            issuer: "gitlab",
            audience: "envlens",
            check_exp: true,
            leeway: 5,
            now: NOW.max(now + 3600),
        };
        assert_eq!(
            decode::<Value>(&good_token, &Hs256Key::new(KEY), &later),
            Err(Refusal::Expired)
        );
    }
}
