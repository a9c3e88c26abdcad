//! "Sign in with GitLab" (SPEC 9): the OAuth 2.0 authorization code flow with PKCE against the
//! GitLab instance as OpenID Connect provider (GitLab's `doc/integration/openid_connect_provider.md`;
//! scopes `openid read_user`). The endpoints come from `/.well-known/openid-configuration`;
//! the ID token is checked with GitLab's published keys (as CI/CD ID tokens are, [`IdTokens`]):
//! signature, `iss` = `gitlab.url`, `aud` = the application's id (and `azp` when there are
//! several audiences), `exp`, and the `nonce` of this attempt. Its `sub` is the GitLab user id.
//!
//! The `oauth2` crate builds the authorization URL and speaks the token request; its HTTP goes
//! through [`GitLab::send_once`], never retried (a code works once).

use std::time::{Duration, Instant};

use oauth2::basic::{
    BasicErrorResponse, BasicRevocationErrorResponse, BasicTokenIntrospectionResponse,
    BasicTokenType,
};
use oauth2::{
    AuthUrl, AuthorizationCode, ClientId, ClientSecret, CsrfToken, EndpointNotSet, EndpointSet,
    ExtraTokenFields, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, RequestTokenError, Scope,
    StandardRevocableToken, StandardTokenResponse, TokenResponse, TokenUrl,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::api::{ApiError, GitLab};
use super::id_token::{IdTokens, Refused};

/// What envlens asks GitLab for: an ID token (`openid`) and the user's identity (`read_user`).
pub const SCOPES: [&str; 2] = ["openid", "read_user"];
/// The discovery document is read again after this long.
const DISCOVERY_MAX_AGE: Duration = Duration::from_secs(3600);

/// The token answer's `id_token` beside the access token.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct IdTokenField {
    id_token: String,
}

impl ExtraTokenFields for IdTokenField {}

type TokenAnswer = StandardTokenResponse<IdTokenField, BasicTokenType>;

type Client = oauth2::Client<
    BasicErrorResponse,
    TokenAnswer,
    BasicTokenIntrospectionResponse,
    StandardRevocableToken,
    BasicRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointSet,
>;

/// GitLab's OpenID Connect endpoints, from its discovery document.
#[derive(Debug, Clone, Deserialize)]
struct Endpoints {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
}

/// The claims of GitLab's ID token that signing in needs; the rest is checked by
/// [`IdTokens::verify_as`].
#[derive(Debug, Deserialize)]
struct IdClaims {
    sub: String,
    #[serde(default)]
    nonce: Option<String>,
    /// A string or a list of them (already checked to contain envlens' application).
    aud: serde_json::Value,
    #[serde(default)]
    azp: Option<String>,
}

/// Why signing in with GitLab failed.
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    /// GitLab said no, or what came back does not check out: the user is not signed in (403).
    #[error("{0}")]
    Refused(String),
    /// GitLab cannot be asked now, or answers what it does not document (503).
    #[error("{0}")]
    Unavailable(String),
}

impl From<ApiError> for SignInError {
    fn from(e: ApiError) -> Self {
        SignInError::Unavailable(e.to_string())
    }
}

/// The start of one attempt: where to send the browser, and what to keep until GitLab sends
/// it back (server-side only: the `state` is the key, the nonce and PKCE verifier its row).
#[derive(Debug)]
pub struct Started {
    pub authorize_url: String,
    pub nonce: String,
    pub pkce_verifier: String,
}

/// The user GitLab signed in.
#[derive(Debug, Clone)]
pub struct GitLabUser {
    pub id: i64,
    /// Their profile (`GET /api/v4/user` with the access token, whose `read_user` scope
    /// allows it): to add a user the mirror lacks, with their state. `None` when it cannot be
    /// had.
    pub profile: Option<super::users::Profile>,
}

/// The OAuth application envlens is at GitLab (`gitlab.client_id`, `gitlab.client_secret_file`).
pub struct Oidc {
    api: GitLab,
    client_id: String,
    /// None for an application that is not confidential: PKCE alone then binds the code.
    client_secret: Option<ClientSecret>,
    id_tokens: IdTokens,
    endpoints: Mutex<Option<(Endpoints, Instant)>>,
}

impl Oidc {
    pub fn new(api: GitLab, client_id: &str, client_secret: Option<&str>) -> Self {
        Oidc {
            id_tokens: IdTokens::new(api.clone(), client_id),
            client_id: client_id.to_owned(),
            client_secret: client_secret.map(|s| ClientSecret::new(s.trim().to_owned())),
            api,
            endpoints: Mutex::new(None),
        }
    }

    /// GitLab's endpoints, read from its discovery document at most hourly. Its `issuer` must
    /// be `gitlab.url`, and the token endpoint under it: the client secret goes nowhere else.
    async fn endpoints(&self) -> Result<Endpoints, SignInError> {
        let mut cached = self.endpoints.lock().await;
        if let Some((endpoints, at)) = cached.as_ref() {
            if at.elapsed() < DISCOVERY_MAX_AGE {
                return Ok(endpoints.clone());
            }
        }
        let endpoints: Endpoints = self
            .api
            .get_public(
                "/.well-known/openid-configuration",
                "/.well-known/openid-configuration",
            )
            .await?;
        let base = self.api.base();
        if endpoints.issuer.trim_end_matches('/') != base {
            return Err(SignInError::Unavailable(format!(
                "GitLab's discovery names the issuer {}, not gitlab.url {base}",
                endpoints.issuer
            )));
        }
        if !endpoints
            .token_endpoint
            .strip_prefix(base)
            .is_some_and(|rest| rest.starts_with('/'))
        {
            return Err(SignInError::Unavailable(format!(
                "GitLab's token endpoint {} is not under gitlab.url",
                endpoints.token_endpoint
            )));
        }
        *cached = Some((endpoints.clone(), Instant::now()));
        Ok(endpoints)
    }

    fn client(&self, endpoints: &Endpoints, redirect_uri: &str) -> Result<Client, SignInError> {
        let bad = |what: &str, e: url::ParseError| {
            SignInError::Unavailable(format!("{what} is not a URL: {e}"))
        };
        let mut client: Client = oauth2::Client::new(ClientId::new(self.client_id.clone()))
            .set_auth_uri(
                AuthUrl::new(endpoints.authorization_endpoint.clone())
                    .map_err(|e| bad("GitLab's authorization endpoint", e))?,
            )
            .set_token_uri(
                TokenUrl::new(endpoints.token_endpoint.clone())
                    .map_err(|e| bad("GitLab's token endpoint", e))?,
            )
            .set_redirect_uri(
                RedirectUrl::new(redirect_uri.to_owned())
                    .map_err(|e| bad("the redirect URI", e))?,
            );
        if let Some(secret) = &self.client_secret {
            client = client.set_client_secret(secret.clone());
        }
        Ok(client)
    }

    /// Starts an attempt whose `state` is `state` (a secret the caller keeps as its key):
    /// GitLab's authorization URL, with a new nonce and PKCE (S256) challenge.
    pub async fn start(&self, redirect_uri: &str, state: &str) -> Result<Started, SignInError> {
        let endpoints = self.endpoints().await?;
        let client = self.client(&endpoints, redirect_uri)?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let nonce = {
            use base64::Engine;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
        };
        let (url, _) = client
            .authorize_url(|| CsrfToken::new(state.to_owned()))
            .add_scopes(SCOPES.iter().map(|s| Scope::new((*s).to_owned())))
            .add_extra_param("nonce", &nonce)
            .set_pkce_challenge(challenge)
            .url();
        Ok(Started {
            authorize_url: url.into(),
            nonce,
            pkce_verifier: verifier.secret().clone(),
        })
    }

    /// Ends an attempt: trades `code` (with the attempt's PKCE verifier) for tokens, checks the
    /// ID token (with the attempt's nonce), and says whom GitLab signed in.
    pub async fn finish(
        &self,
        redirect_uri: &str,
        code: &str,
        pkce_verifier: &str,
        nonce: &str,
    ) -> Result<GitLabUser, SignInError> {
        let endpoints = self.endpoints().await?;
        let client = self.client(&endpoints, redirect_uri)?;
        let http = TokenClient(&self.api);
        let answer = client
            .exchange_code(AuthorizationCode::new(code.to_owned()))
            .set_pkce_verifier(PkceCodeVerifier::new(pkce_verifier.to_owned()))
            .request_async(&http)
            .await
            .map_err(|e| match e {
                RequestTokenError::ServerResponse(e) => {
                    let mut why = format!("GitLab refused the sign-in: {}", e.error());
                    if let Some(description) = e.error_description() {
                        why.push_str(&format!(" ({description})"));
                    }
                    SignInError::Refused(why)
                }
                RequestTokenError::Request(e) => SignInError::Unavailable(e.to_string()),
                RequestTokenError::Parse(e, _) => SignInError::Unavailable(format!(
                    "GitLab's token answer is not what it documents: {e}"
                )),
                RequestTokenError::Other(e) => SignInError::Unavailable(e),
            })?;
        let claims: IdClaims = self
            .id_tokens
            .verify_as(&answer.extra_fields().id_token)
            .await
            .map_err(|e| match e {
                Refused::Keys(e) => SignInError::Unavailable(e.to_string()),
                other => {
                    SignInError::Refused(format!("GitLab's ID token does not check out: {other}"))
                }
            })?;
        check_claims(&claims, &self.client_id, nonce)?;
        let id = claims.sub.parse::<i64>().map_err(|_| {
            SignInError::Refused(format!(
                "the ID token's subject `{}` is not a GitLab user id",
                claims.sub
            ))
        })?;
        let profile = super::users::own_profile(&self.api, answer.access_token().secret(), None)
            .await
            .ok()
            .flatten()
            .filter(|p| p.id == id);
        Ok(GitLabUser { id, profile })
    }
}

/// The token request's HTTP, through GitLab's client.
struct TokenClient<'a>(&'a GitLab);

impl<'c> oauth2::AsyncHttpClient<'c> for TokenClient<'_> {
    type Error = ApiError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<oauth2::HttpResponse, ApiError>> + Send + 'c>,
    >;

    fn call(&'c self, request: oauth2::HttpRequest) -> Self::Future {
        Box::pin(self.0.send_once("/oauth/token", request))
    }
}

/// The checks of the ID token that the signature does not make: meant for this application
/// (`azp` when several audiences), for this attempt (`nonce`).
fn check_claims(claims: &IdClaims, client_id: &str, nonce: &str) -> Result<(), SignInError> {
    if let Some(audiences) = claims.aud.as_array() {
        if audiences.len() > 1 && claims.azp.as_deref() != Some(client_id) {
            return Err(SignInError::Refused(
                "GitLab's ID token names several audiences and is not authorized for envlens"
                    .into(),
            ));
        }
    }
    let same_nonce = claims.nonce.as_deref().is_some_and(|sent| {
        bool::from(subtle::ConstantTimeEq::ct_eq(
            sent.as_bytes(),
            nonce.as_bytes(),
        ))
    });
    if !same_nonce {
        return Err(SignInError::Refused(
            "GitLab's ID token is not for this sign-in (its nonce differs)".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(aud: serde_json::Value, azp: Option<&str>, nonce: Option<&str>) -> IdClaims {
        IdClaims {
            sub: "7".into(),
            nonce: nonce.map(Into::into),
            aud,
            azp: azp.map(Into::into),
        }
    }

    #[test]
    fn the_nonce_and_authorized_party_must_match() {
        let one = || serde_json::json!("app");
        assert!(check_claims(&claims(one(), None, Some("n")), "app", "n").is_ok());
        assert!(check_claims(&claims(one(), None, Some("m")), "app", "n").is_err());
        assert!(check_claims(&claims(one(), None, None), "app", "n").is_err());
        let several = || serde_json::json!(["app", "other"]);
        assert!(check_claims(&claims(several(), Some("app"), Some("n")), "app", "n").is_ok());
        assert!(check_claims(&claims(several(), Some("other"), Some("n")), "app", "n").is_err());
        assert!(check_claims(&claims(several(), None, Some("n")), "app", "n").is_err());
        let single = serde_json::json!(["app"]);
        assert!(check_claims(&claims(single, None, Some("n")), "app", "n").is_ok());
    }
}
