//! An in-process GitLab on a socket, answering as GitLab documents itself: its OpenID Connect
//! discovery and key set (`doc/integration/openid_connect_provider.md`), CI/CD ID tokens
//! signed with the keys it publishes (`doc/ci/secrets/id_token_authentication.md`), the
//! OAuth 2.0 provider of "Sign in with GitLab" (`doc/api/oauth2.md`: authorize, token with
//! PKCE, userinfo; see [`OAuth`]), and its REST API (`gitlab_rest`).

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

/// A token the test GitLab accepts: its user (as `GET /api/v4/user` answers) and its kind.
#[derive(Debug, Clone)]
pub struct TestToken {
    pub user: Value,
    pub kind: TokenKind,
}

#[derive(Debug, Clone)]
pub enum TokenKind {
    /// A personal, project or group access token; an inactive one (revoked, expired) is
    /// refused as GitLab refuses it, with 401.
    Access { scopes: Vec<String>, active: bool },
    /// An OAuth access token issued to the application `application` (its `uid`).
    OAuth {
        scopes: Vec<String>,
        application: String,
    },
}

impl TestToken {
    fn scopes(&self) -> &[String] {
        match &self.kind {
            TokenKind::Access { scopes, .. } | TokenKind::OAuth { scopes, .. } => scopes,
        }
    }
}

type Tokens = Arc<std::sync::Mutex<std::collections::HashMap<String, TestToken>>>;

pub struct TestGitLab {
    pub url: String,
    /// Every token GitLab accepts, by its text.
    pub tokens: Tokens,
    /// How often `/api/v4/user` was asked, and whether the token endpoints answer 500 (GitLab
    /// down).
    pub user_requests: Arc<AtomicUsize>,
    /// How often a token was looked at: `/api/v4/personal_access_tokens/self` and
    /// `/oauth/token/info`.
    pub token_checks: Arc<AtomicUsize>,
    pub failing: Arc<std::sync::atomic::AtomicBool>,
    /// How often the key set was fetched.
    pub key_fetches: Arc<AtomicUsize>,
    /// The OAuth provider's state: the application, who is signed in at GitLab, codes.
    pub oauth: Arc<std::sync::Mutex<OAuth>>,
    /// The REST API's data, its log of calls and its faults.
    pub rest: super::gitlab_rest::Rest,
    /// Its agent server's side: the metadata, and the tokens and `user_access` it authorizes.
    pub kas: super::gitlab_kas::KasSide,
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
        // The REST API's own tokens are users' tokens too: `GET /user` names their user.
        let tokens: Tokens = Arc::default();
        {
            use super::gitlab_rest::{
                API_TOKEN, API_TOKEN_USER, REGULAR_API_TOKEN, REGULAR_API_TOKEN_USER,
            };
            let mut admin = own_user(&url, API_TOKEN_USER.0, API_TOKEN_USER.1);
            admin["is_admin"] = json!(true);
            let mut regular = own_user(&url, REGULAR_API_TOKEN_USER.0, REGULAR_API_TOKEN_USER.1);
            // GitLab's `UserPublic`: `is_admin` only in an administrator's answers.
            regular.as_object_mut().unwrap().remove("is_admin");
            let read_api = || TokenKind::Access {
                scopes: vec!["read_api".into()],
                active: true,
            };
            let mut known = tokens.lock().unwrap();
            known.insert(
                API_TOKEN.into(),
                TestToken {
                    user: admin,
                    kind: read_api(),
                },
            );
            known.insert(
                REGULAR_API_TOKEN.into(),
                TestToken {
                    user: regular,
                    kind: read_api(),
                },
            );
        }
        let user_requests = Arc::new(AtomicUsize::new(0));
        let token_checks = Arc::new(AtomicUsize::new(0));
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let oauth: Arc<std::sync::Mutex<OAuth>> = Arc::default();
        let provider = Provider {
            oauth: oauth.clone(),
            issuer: url.clone(),
            rsa: rsa.clone(),
            tokens: tokens.clone(),
        };
        let rest = super::gitlab_rest::Rest::default();
        let api = TokenApi {
            tokens: tokens.clone(),
            user_requests: user_requests.clone(),
            token_checks: token_checks.clone(),
            failing: failing.clone(),
        };
        let token_routes = Router::new()
            .route("/api/v4/user", get(current_user))
            .route(
                "/api/v4/personal_access_tokens/self",
                get(access_token_self),
            )
            .route("/oauth/token/info", get(token_info))
            .with_state(api);
        let router = Router::new()
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
            .route("/oauth/authorize", get(authorize))
            .route("/oauth/token", axum::routing::post(token))
            .route("/oauth/userinfo", get(userinfo))
            .route(
                "/oauth/discovery/keys",
                get(move || {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    let set = serde_json::to_value(&set).unwrap();
                    async move { Json(set) }
                }),
            );
        // Whatever the routes above do not answer is the REST API's.
        let rest_api = Router::new()
            .fallback(super::gitlab_rest::handle)
            .with_state(rest.clone());
        let kas = super::gitlab_kas::KasSide::default();
        let router = router
            .with_state(provider)
            .merge(token_routes)
            .merge(kas.routes())
            .fallback_service(rest_api);
        tokio::spawn(async move { axum::serve(listener, router).await });
        TestGitLab {
            oauth,
            url,
            tokens,
            user_requests,
            token_checks,
            failing,
            key_fetches,
            rest,
            kas,
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

/// A user as `GET /api/v4/user` answers about oneself (`doc/api/users.md`).
pub fn own_user(base: &str, id: i64, username: &str) -> Value {
    json!({"id": id, "username": username, "name": username, "state": "active",
           "locked": false, "avatar_url": null, "web_url": format!("{base}/{username}"),
           "created_at": "2026-01-01T00:00:00.000Z", "bio": "", "public_email": null,
           "email": format!("{username}@example.com"), "is_admin": false, "external": false,
           "two_factor_enabled": false})
}

impl TestGitLab {
    /// A personal access token GitLab accepts for user `id`, with the scope `api`.
    pub fn accept_token(&self, token: &str, id: i64, username: &str) {
        self.accept_access_token(token, id, username, &["api"]);
    }

    /// A personal (project, group) access token of user `id` with these scopes.
    pub fn accept_access_token(&self, token: &str, id: i64, username: &str, scopes: &[&str]) {
        self.add_token(
            token,
            TestToken {
                user: own_user(&self.url, id, username),
                kind: TokenKind::Access {
                    scopes: scopes.iter().map(|s| s.to_string()).collect(),
                    active: true,
                },
            },
        );
    }

    /// An OAuth access token of user `id` issued to the application `application`.
    pub fn accept_oauth_token(
        &self,
        token: &str,
        id: i64,
        username: &str,
        application: &str,
        scopes: &[&str],
    ) {
        self.add_token(
            token,
            TestToken {
                user: own_user(&self.url, id, username),
                kind: TokenKind::OAuth {
                    scopes: scopes.iter().map(|s| s.to_string()).collect(),
                    application: application.into(),
                },
            },
        );
    }

    pub fn add_token(&self, token: &str, test_token: TestToken) {
        self.tokens
            .lock()
            .unwrap()
            .insert(token.to_owned(), test_token);
    }
}

/// The token endpoints' shared state.
#[derive(Clone)]
struct TokenApi {
    tokens: Tokens,
    user_requests: Arc<AtomicUsize>,
    token_checks: Arc<AtomicUsize>,
    failing: Arc<std::sync::atomic::AtomicBool>,
}

impl TokenApi {
    /// The request's token (`Authorization: Bearer`, or `PRIVATE-TOKEN`), if GitLab has it.
    fn token(&self, headers: &axum::http::HeaderMap) -> Option<TestToken> {
        let sent = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .or_else(|| headers.get("private-token").and_then(|v| v.to_str().ok()))?;
        self.tokens.lock().unwrap().get(sent).cloned()
    }

    fn down(&self) -> Option<axum::response::Response> {
        use axum::response::IntoResponse;
        self.failing.load(Ordering::SeqCst).then(|| {
            (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"message": "500 Internal Server Error"})),
            )
                .into_response()
        })
    }
}

fn api_error(status: u16, body: Value) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::from_u16(status).unwrap(),
        Json(body),
    )
        .into_response()
}

/// GitLab's API takes a token only when it is known, live, and its user active.
fn live(token: Option<TestToken>) -> Option<TestToken> {
    token.filter(|t| {
        !matches!(t.kind, TokenKind::Access { active: false, .. }) && t.user["state"] == "active"
    })
}

fn unauthorized() -> axum::response::Response {
    api_error(401, json!({"message": "401 Unauthorized"}))
}

/// `GET /api/v4/user`: needs `read_user`, `read_api` or `api`; a token without is 403
/// `insufficient_scope`, as GitLab answers it.
async fn current_user(
    axum::extract::State(api): axum::extract::State<TokenApi>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    api.user_requests.fetch_add(1, Ordering::SeqCst);
    if let Some(down) = api.down() {
        return down;
    }
    let Some(token) = live(api.token(&headers)) else {
        return unauthorized();
    };
    if !token
        .scopes()
        .iter()
        .any(|s| ["read_user", "read_api", "api"].contains(&s.as_str()))
    {
        return api_error(
            403,
            json!({"error": "insufficient_scope",
                   "error_description": "The request requires higher privileges than provided by the access token.",
                   "scope": "api read_api read_user"}),
        );
    }
    Json(token.user).into_response()
}

/// `GET /api/v4/personal_access_tokens/self` (`doc/api/personal_access_tokens.md`): an access
/// token's own record, whatever its scopes; an OAuth token is no access token (404).
async fn access_token_self(
    axum::extract::State(api): axum::extract::State<TokenApi>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    api.token_checks.fetch_add(1, Ordering::SeqCst);
    if let Some(down) = api.down() {
        return down;
    }
    let Some(token) = live(api.token(&headers)) else {
        return unauthorized();
    };
    match &token.kind {
        TokenKind::Access { scopes, .. } => Json(json!({
            "id": 4, "name": "envlens", "revoked": false, "created_at": "2026-01-01T00:00:00.000Z",
            "description": "", "scopes": scopes, "user_id": token.user["id"],
            "last_used_at": "2026-11-27T10:00:00.000Z", "active": true, "expires_at": null,
        }))
        .into_response(),
        TokenKind::OAuth { .. } => api_error(404, json!({"message": "404 Not Found"})),
    }
}

/// `GET /oauth/token/info` (Doorkeeper's, `doc/api/oauth2.md`): an OAuth token's owner,
/// scopes and application; anything else is `invalid_token`.
async fn token_info(
    axum::extract::State(api): axum::extract::State<TokenApi>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    api.token_checks.fetch_add(1, Ordering::SeqCst);
    if let Some(down) = api.down() {
        return down;
    }
    let invalid = || {
        api_error(
            401,
            json!({"error": "invalid_token", "error_description": "The access token is invalid"}),
        )
    };
    match api.token(&headers) {
        Some(TestToken {
            user,
            kind:
                TokenKind::OAuth {
                    scopes,
                    application,
                },
        }) => Json(json!({
            "resource_owner_id": user["id"], "scope": scopes, "expires_in": 7200,
            "application": {"uid": application}, "created_at": 1_800_000_000,
            "scopes": scopes, "expires_in_seconds": 7200,
        }))
        .into_response(),
        _ => invalid(),
    }
}

/// GitLab as OAuth 2.0 / OpenID Connect provider, as `doc/api/oauth2.md` and
/// `doc/integration/openid_connect_provider.md` describe it: one registered application, the
/// user signed in at GitLab (who approves at once), authorization codes bound to the client,
/// the redirect URI and the PKCE challenge, each usable once.
#[derive(Default)]
pub struct OAuth {
    /// `(client_id, client_secret, redirect_uri)` of the registered application.
    pub application: Option<(String, String, String)>,
    /// Who is signed in at GitLab: `(id, username)`. None: the user clicks "Deny".
    pub signed_in: Option<(i64, String)>,
    /// Overrides of the next ID tokens' claims, for tests of what envlens must refuse.
    pub id_token_audience: Option<Value>,
    pub id_token_nonce: Option<String>,
    /// Token requests answered, and codes issued.
    pub token_requests: usize,
    codes: std::collections::HashMap<String, Grant>,
    access_tokens: std::collections::HashMap<String, (i64, String)>,
}

struct Grant {
    client_id: String,
    redirect_uri: String,
    code_challenge: String,
    nonce: Option<String>,
    user: (i64, String),
}

#[derive(Clone)]
struct Provider {
    oauth: Arc<std::sync::Mutex<OAuth>>,
    issuer: String,
    rsa: EncodingKey,
    /// Where the access tokens it issues are registered for the API.
    tokens: Tokens,
}

fn random_token() -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

fn oauth_error(status: u16, error: &str, description: &str) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::from_u16(status).unwrap(),
        Json(json!({"error": error, "error_description": description})),
    )
        .into_response()
}

/// `GET /oauth/authorize`: checks the request as Doorkeeper does, then (the user being signed
/// in and approving) redirects to the application with a code, or with `error=access_denied`.
async fn authorize(
    axum::extract::State(provider): axum::extract::State<Provider>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut oauth = provider.oauth.lock().unwrap();
    let Some((client_id, _, redirect_uri)) = oauth.application.clone() else {
        return oauth_error(401, "invalid_client", "no application");
    };
    let param = |name: &str| q.get(name).map(String::as_str);
    if param("client_id") != Some(&client_id) {
        return oauth_error(401, "invalid_client", "Client authentication failed");
    }
    if param("redirect_uri") != Some(&redirect_uri) {
        return oauth_error(
            400,
            "invalid_redirect_uri",
            "The redirect uri included is not valid.",
        );
    }
    let scopes: Vec<&str> = param("scope").unwrap_or_default().split(' ').collect();
    let method = param("code_challenge_method");
    let ok = param("response_type") == Some("code")
        && scopes.contains(&"openid")
        && scopes.contains(&"read_user")
        && param("state").is_some()
        && param("code_challenge").is_some()
        && method == Some("S256");
    if !ok {
        return oauth_error(
            400,
            "invalid_request",
            "The request is missing a required parameter.",
        );
    }
    let state: String =
        url::form_urlencoded::byte_serialize(param("state").unwrap().as_bytes()).collect();
    let location = match oauth.signed_in.clone() {
        Some(user) => {
            let code = random_token();
            oauth.codes.insert(
                code.clone(),
                Grant {
                    client_id,
                    redirect_uri: redirect_uri.clone(),
                    code_challenge: param("code_challenge").unwrap().to_owned(),
                    nonce: param("nonce").map(str::to_owned),
                    user,
                },
            );
            format!("{redirect_uri}?code={code}&state={state}")
        }
        None => format!(
            "{redirect_uri}?error=access_denied&error_description=The+resource+owner+or+authorization+server+denied+the+request.&state={state}"
        ),
    };
    (
        axum::http::StatusCode::FOUND,
        [(axum::http::header::LOCATION, location)],
    )
        .into_response()
}

/// `POST /oauth/token` (`grant_type=authorization_code`): the client authenticated (HTTP Basic
/// or form fields), the code known and not used before, issued to this client and redirect URI,
/// and the PKCE verifier's S256 equal to the challenge. A code is gone after its first use,
/// whatever the outcome, as Doorkeeper revokes it.
async fn token(
    axum::extract::State(provider): axum::extract::State<Provider>,
    headers: axum::http::HeaderMap,
    body: bytes::Bytes,
) -> axum::response::Response {
    use base64::Engine;
    use sha2::Digest;
    let form: std::collections::HashMap<String, String> =
        url::form_urlencoded::parse(&body).into_owned().collect();
    let mut oauth = provider.oauth.lock().unwrap();
    oauth.token_requests += 1;
    let Some((client_id, client_secret, _)) = oauth.application.clone() else {
        return oauth_error(401, "invalid_client", "no application");
    };
    let basic = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
        .and_then(|v| String::from_utf8(v).ok())
        .and_then(|v| {
            let (id, secret) = v.split_once(':')?;
            let decode = |s: &str| {
                url::form_urlencoded::parse(format!("x={s}").as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
            };
            Some((decode(id)?, decode(secret)?))
        });
    let (sent_id, sent_secret) = basic.unwrap_or_else(|| {
        (
            form.get("client_id").cloned().unwrap_or_default(),
            form.get("client_secret").cloned().unwrap_or_default(),
        )
    });
    if sent_id != client_id || sent_secret != client_secret {
        return oauth_error(401, "invalid_client", "Client authentication failed due to unknown client, no client authentication included, or unsupported authentication method.");
    }
    let invalid_grant = || {
        oauth_error(400, "invalid_grant", "The provided authorization grant is invalid, expired, revoked, does not match the redirection URI used in the authorization request, or was issued to another client.")
    };
    if form.get("grant_type").map(String::as_str) != Some("authorization_code") {
        return oauth_error(
            400,
            "unsupported_grant_type",
            "The authorization grant type is not supported by the authorization server.",
        );
    }
    let Some(grant) = form.get("code").and_then(|code| oauth.codes.remove(code)) else {
        return invalid_grant();
    };
    let verifier = form.get("code_verifier").cloned().unwrap_or_default();
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(verifier.as_bytes()));
    if grant.client_id != sent_id
        || form.get("redirect_uri") != Some(&grant.redirect_uri)
        || challenge != grant.code_challenge
    {
        return invalid_grant();
    }
    let now = chrono::Utc::now().timestamp();
    let (id, username) = grant.user.clone();
    let claims = json!({
        "iss": provider.issuer,
        "sub": id.to_string(),
        "aud": oauth.id_token_audience.clone().unwrap_or_else(|| json!(client_id)),
        "exp": now + 120,
        "iat": now,
        "auth_time": now - 10,
        "sub_legacy": format!("legacy-{id}"),
        "nonce": oauth.id_token_nonce.clone().or(grant.nonce),
    });
    let header = Header {
        alg: Algorithm::RS256,
        kid: Some(RSA_KID.to_owned()),
        ..Header::default()
    };
    let id_token = jsonwebtoken::encode(&header, &claims, &provider.rsa).unwrap();
    let access_token = random_token();
    provider.tokens.lock().unwrap().insert(
        access_token.clone(),
        TestToken {
            user: own_user(&provider.issuer, id, &username),
            kind: TokenKind::OAuth {
                scopes: vec!["openid".into(), "read_user".into()],
                application: client_id.clone(),
            },
        },
    );
    oauth
        .access_tokens
        .insert(access_token.clone(), (id, username));
    use axum::response::IntoResponse;
    Json(json!({
        "access_token": access_token,
        "token_type": "Bearer",
        "expires_in": 7200,
        "refresh_token": random_token(),
        "scope": "openid read_user",
        "created_at": now,
        "id_token": id_token,
    }))
    .into_response()
}

/// `GET /oauth/userinfo` with the access token: the user's claims.
async fn userinfo(
    axum::extract::State(provider): axum::extract::State<Provider>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let user = provider
        .oauth
        .lock()
        .unwrap()
        .access_tokens
        .get(token)
        .cloned();
    match user {
        Some((id, username)) => Json(json!({
            "sub": id.to_string(), "sub_legacy": format!("legacy-{id}"), "name": username,
            "nickname": username, "preferred_username": username,
            "email": format!("{username}@example.com"), "email_verified": true,
            "profile": format!("{}/{username}", provider.issuer), "groups": [],
        }))
        .into_response(),
        None => oauth_error(401, "invalid_token", "The access token is invalid"),
    }
}
