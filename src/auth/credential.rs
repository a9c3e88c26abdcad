//! The viewer's own credential, carried from one replica to another (SPEC 16): the headers a
//! request authenticated with, never a claim of who the viewer is. The replica that receives
//! it authenticates the viewer afresh with [`Credential::authenticate`], the same way the
//! first one did ([`super::authenticate`]), so it judges nothing looser.

use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Request};

use super::dashboard::COOKIE_NAME as DASHBOARD_COOKIE;
use super::session::{authenticate, csrf_token, Session, CSRF_HEADER, SESSION_COOKIE};
use super::Keys;
use crate::error::Error;
use crate::gitlab::tokens::Purpose;
use crate::gitlab::Instance;

/// At most this many bytes of credential are carried: a session token is a few hundred.
const MAX_LEN: usize = 16 * 1024;

/// What authenticated a request: its `Authorization` header, its session cookies (only
/// GitLab's `_gitlab_kas` and the dashboard's `envlens_session`, no other cookie), and its CSRF
/// token (the header, or a WebSocket's query parameter).
#[derive(Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Credential {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    authorization: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cookie: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    csrf: Option<String>,
}

/// Never printed: it is someone's session.
impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(..)")
    }
}

impl Credential {
    /// The credential of a request, as [`super::authenticate`] read it.
    pub fn of(parts: &Parts) -> Credential {
        Credential::of_headers(&parts.headers, csrf_token(parts))
    }

    /// From headers, with the CSRF token found elsewhere (a WebSocket's `connection_init`).
    pub fn of_headers(headers: &HeaderMap, csrf: Option<String>) -> Credential {
        let authorization = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let cookies: Vec<&str> = headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .map(str::trim)
            .filter(|pair| {
                pair.split_once('=')
                    .is_some_and(|(name, _)| name == SESSION_COOKIE || name == DASHBOARD_COOKIE)
            })
            .collect();
        Credential {
            authorization,
            cookie: (!cookies.is_empty()).then(|| cookies.join("; ")),
            csrf: csrf.or_else(|| {
                headers
                    .get(CSRF_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            }),
        }
    }

    /// Whether there is anything to carry.
    pub fn is_empty(&self) -> bool {
        self.authorization.is_none() && self.cookie.is_none()
    }

    /// As carried in a replica's token.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// As carried in a replica's token; `None` for anything else.
    pub fn decode(text: &str) -> Option<Credential> {
        if text.len() > MAX_LEN {
            return None;
        }
        serde_json::from_str(text).ok()
    }

    /// Authenticates the viewer afresh, as the request it was read from was.
    pub async fn authenticate(
        &self,
        keys: &Keys,
        gitlab: Option<&Instance>,
    ) -> Result<Session, Error> {
        let mut request = Request::post("/api/graphql");
        let headers = [
            (AUTHORIZATION.as_str(), &self.authorization),
            (COOKIE.as_str(), &self.cookie),
            (CSRF_HEADER, &self.csrf),
        ];
        for (name, value) in headers {
            if let Some(value) = value {
                let value = HeaderValue::from_str(value)
                    .map_err(|_| Error::Unauthorized("token is malformed".into()))?;
                request = request.header(name, value);
            }
        }
        let (parts, ()) = request
            .body(())
            .map_err(|_| Error::Unauthorized("token is malformed".into()))?
            .into_parts();
        authenticate(&parts, keys, gitlab, Purpose::Api).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_session_cookies_and_the_csrf_token_are_carried() {
        let request = Request::get("/api/graphql")
            .header(COOKIE, "theme=dark; _gitlab_kas=abc; other=1")
            .header(COOKIE, "envlens_session=def")
            .header(CSRF_HEADER, "xyz")
            .header("x-other", "no")
            .body(())
            .unwrap();
        let credential = Credential::of(&request.into_parts().0);
        assert_eq!(
            credential.cookie.as_deref(),
            Some("_gitlab_kas=abc; envlens_session=def")
        );
        assert_eq!(credential.csrf.as_deref(), Some("xyz"));
        assert_eq!(credential.authorization, None);
        let again = Credential::decode(&credential.encode()).unwrap();
        assert_eq!(again, credential);
        assert!(!again.is_empty());
        assert_eq!(format!("{again:?}"), "Credential(..)");
        assert!(Credential::decode("not json").is_none());
        assert!(Credential::default().is_empty());
    }
}
