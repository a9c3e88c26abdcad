//! An in-process GitLab on a socket, answering as GitLab documents itself: its OpenID Connect
//! discovery and key set (`doc/integration/openid_connect_provider.md`), and CI/CD ID tokens
//! signed with the keys it publishes (`doc/ci/secrets/id_token_authentication.md`), and its REST
//! API (`gitlab_rest`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

const RSA_KID: &str = "gitlab-rsa-1";
const EC_KID: &str = "gitlab-ec-1";

fn key_file(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/keys/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// How a test token is signed.
#[derive(Debug, Clone, Copy)]
pub enum Signer {
    /// GitLab's RSA key, RS256, its `kid`.
    Rsa,
    /// GitLab's P-256 key, ES256, its `kid`.
    Ec,
    /// A key GitLab does not publish, under the `kid` of GitLab's RSA key.
    Forged,
    /// GitLab's RSA key with a `kid` GitLab does not publish.
    UnknownKid,
    /// `alg: none`, no signature.
    NoAlgorithm,
    /// HS256 with GitLab's public RSA key (its PEM) as the secret: algorithm confusion.
    HmacWithPublicKey,
    /// GitLab's RSA key, but RS384.
    Rs384,
}

pub struct TestGitLab {
    pub url: String,
    /// `GET /api/v4/user`: the user of each token GitLab accepts (its documented answer).
    pub users_by_token: Arc<std::sync::Mutex<std::collections::HashMap<String, Value>>>,
    /// How often `/api/v4/user` was asked, and whether it answers 500 (GitLab down).
    pub user_requests: Arc<AtomicUsize>,
    pub failing: Arc<std::sync::atomic::AtomicBool>,
    /// How often the key set was fetched.
    pub key_fetches: Arc<AtomicUsize>,
    /// The REST API's data, its log of calls and its faults.
    pub rest: super::gitlab_rest::Rest,
    rsa: EncodingKey,
    ec: EncodingKey,
    other: EncodingKey,
    public_pem: Vec<u8>,
}

impl TestGitLab {
    pub async fn start() -> TestGitLab {
        let rsa = EncodingKey::from_rsa_der(&key_file("gitlab-rsa.der"));
        let ec = EncodingKey::from_ec_der(&key_file("gitlab-ec.der"));
        let other = EncodingKey::from_rsa_der(&key_file("other-rsa.der"));
        let mut rsa_jwk = Jwk::from_encoding_key(&rsa, Algorithm::RS256).unwrap();
        rsa_jwk.common.key_id = Some(RSA_KID.into());
        rsa_jwk.common.public_key_use = Some(jsonwebtoken::jwk::PublicKeyUse::Signature);
        let mut ec_jwk = Jwk::from_encoding_key(&ec, Algorithm::ES256).unwrap();
        ec_jwk.common.key_id = Some(EC_KID.into());
        let set = JwkSet {
            keys: vec![rsa_jwk, ec_jwk],
        };
        let public_pem = key_file("gitlab-rsa.pub.pem");

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let key_fetches = Arc::new(AtomicUsize::new(0));
        let fetches = key_fetches.clone();
        let issuer = url.clone();
        let users_by_token: Arc<std::sync::Mutex<std::collections::HashMap<String, Value>>> =
            Arc::default();
        let user_requests = Arc::new(AtomicUsize::new(0));
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (users, asked, down) = (
            users_by_token.clone(),
            user_requests.clone(),
            failing.clone(),
        );
        let rest = super::gitlab_rest::Rest::default();
        let router = Router::new()
            .route(
                "/api/v4/user",
                get(move |headers: axum::http::HeaderMap| {
                    asked.fetch_add(1, Ordering::SeqCst);
                    let token = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Bearer "))
                        .or_else(|| headers.get("private-token").and_then(|v| v.to_str().ok()))
                        .unwrap_or_default()
                        .to_owned();
                    let user = users.lock().unwrap().get(&token).cloned();
                    let down = down.load(Ordering::SeqCst);
                    async move {
                        use axum::http::StatusCode;
                        match (down, user) {
                            (true, _) => (
                                StatusCode::INTERNAL_SERVER_ERROR,
                                Json(json!({"message": "500 Internal Server Error"})),
                            ),
                            (false, Some(user)) => (StatusCode::OK, Json(user)),
                            (false, None) => (
                                StatusCode::UNAUTHORIZED,
                                Json(json!({"message": "401 Unauthorized"})),
                            ),
                        }
                    }
                }),
            )
            .route(
                "/.well-known/openid-configuration",
                get(move || {
                    let issuer = issuer.clone();
                    async move {
                        Json(json!({
                            "issuer": issuer,
                            "authorization_endpoint": format!("{issuer}/oauth/authorize"),
                            "token_endpoint": format!("{issuer}/oauth/token"),
                            "userinfo_endpoint": format!("{issuer}/oauth/userinfo"),
                            "jwks_uri": format!("{issuer}/oauth/discovery/keys"),
                            "response_types_supported": ["code"],
                            "subject_types_supported": ["public"],
                            "id_token_signing_alg_values_supported": ["RS256"],
                        }))
                    }
                }),
            )
            .route(
                "/oauth/discovery/keys",
                get(move || {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    let set = serde_json::to_value(&set).unwrap();
                    async move { Json(set) }
                }),
            )
            .fallback(super::gitlab_rest::handle)
            .with_state(rest.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        TestGitLab {
            url,
            users_by_token,
            user_requests,
            failing,
            key_fetches,
            rest,
            rsa,
            ec,
            other,
            public_pem,
        }
    }

    /// The claims GitLab puts in a deploy job's ID token (its documented example), for
    /// `audience`, valid for five minutes.
    pub fn job_claims(&self, audience: &str) -> Value {
        let now = chrono::Utc::now().timestamp();
        json!({
            "namespace_id": "72", "namespace_path": "acme/apps",
            "project_id": "42", "project_path": "acme/apps/web",
            "user_id": "2", "user_login": "dev", "user_email": "dev@example.com",
            "user_access_level": "developer",
            "pipeline_id": "574", "pipeline_source": "push",
            "job_id": "302", "ref": "main", "ref_type": "branch", "ref_path": "refs/heads/main",
            "ref_protected": "true", "environment": "production", "environment_protected": "true",
            "deployment_tier": "production", "environment_action": "start",
            "runner_id": 1, "runner_environment": "self-hosted", "sha": "714a629c0b401fdce83e847fc9589983fc6f46bc",
            "project_visibility": "private", "ci_config_ref_uri": "gitlab.example.com/acme/apps/web//.gitlab-ci.yml@refs/heads/main",
            "ci_config_sha": "714a629c0b401fdce83e847fc9589983fc6f46bc",
            "jti": "235b3a54-b797-45c7-ae9a-f72d7bc6ef5b",
            "iss": self.url, "iat": now, "nbf": now - 5, "exp": now + 300,
            "sub": "project_path:acme/apps/web:ref_type:branch:ref:main",
            "aud": audience,
        })
    }

    pub fn sign(&self, claims: &Value, signer: Signer) -> String {
        let header = |alg, kid: &str| Header {
            alg,
            kid: Some(kid.to_owned()),
            ..Header::default()
        };
        match signer {
            Signer::Rsa => {
                jsonwebtoken::encode(&header(Algorithm::RS256, RSA_KID), claims, &self.rsa)
            }
            Signer::Ec => jsonwebtoken::encode(&header(Algorithm::ES256, EC_KID), claims, &self.ec),
            Signer::Forged => {
                jsonwebtoken::encode(&header(Algorithm::RS256, RSA_KID), claims, &self.other)
            }
            Signer::UnknownKid => {
                jsonwebtoken::encode(&header(Algorithm::RS256, "rotated-away"), claims, &self.rsa)
            }
            Signer::Rs384 => {
                jsonwebtoken::encode(&header(Algorithm::RS384, RSA_KID), claims, &self.rsa)
            }
            Signer::HmacWithPublicKey => jsonwebtoken::encode(
                &header(Algorithm::HS256, RSA_KID),
                claims,
                &EncodingKey::from_secret(&self.public_pem),
            ),
            Signer::NoAlgorithm => {
                use base64::Engine;
                let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
                let head =
                    b64.encode(json!({"alg": "none", "typ": "JWT", "kid": RSA_KID}).to_string());
                let body = b64.encode(claims.to_string());
                return format!("{head}.{body}.");
            }
        }
        .unwrap()
    }
}

impl TestGitLab {
    /// A token GitLab accepts for user `id`, answering `/api/v4/user` as its documentation shows.
    pub fn accept_token(&self, token: &str, id: i64, username: &str) {
        self.users_by_token.lock().unwrap().insert(
            token.to_owned(),
            json!({"id": id, "username": username, "name": username, "state": "active",
                   "locked": false, "avatar_url": null, "web_url": format!("{}/{username}", self.url),
                   "created_at": "2026-01-01T00:00:00.000Z", "bio": "", "public_email": null,
                   "email": format!("{username}@example.com"), "is_admin": false, "two_factor_enabled": false}),
        );
    }
}
