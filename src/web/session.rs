//! Who is signed in to the dashboard: the `envlens_session` cookie (an opaque random id; the
//! database keeps its SHA-256, the user, a CSRF token and when it expires), the [`Viewer`]
//! extractor of pages, [`begin`] to sign a user in, and `POST /-/sign-out`.
//!
//! The cookie is `HttpOnly` (no script reads it), `SameSite=Lax` (no other site's form or
//! script sends it; a link followed to envlens does), `Path=/`, `Secure` when `--public-url`
//! is https, and expires with the session (`Max-Age`). Every state-changing request carries the
//! session's CSRF token: the form field [`CSRF_FIELD`] or the header `X-Csrf-Token`.

use std::fmt::Write;

use axum::extract::{FromRef, FromRequestParts, OptionalFromRequestParts, OriginalUri, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::html;
use super::Site;
use crate::auth::dashboard::{self, COOKIE_NAME};
use crate::auth::CSRF_HEADER;
use crate::db;
use crate::db::pool::Pool;
use crate::error::Error;

/// `POST` here ends the session.
pub const SIGN_OUT_PATH: &str = "/-/sign-out";
/// The form field that carries the CSRF token of a form post.
pub const CSRF_FIELD: &str = "csrf";
/// A `return_to` longer than this is not followed.
const MAX_RETURN_TO: usize = 2048;

/// The signed-in user of a dashboard page, from the `envlens_session` cookie.
///
/// Without a live session, a page is answered with a redirect to
/// `/-/sign-in?return_to=<this page>`; take `Option<Viewer>` where a page is for everyone.
/// A state-changing handler checks [`Viewer::check_csrf`] before it changes anything.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub user_id: i64,
    pub username: String,
    pub admin: bool,
    /// The session's CSRF token: render it into forms ([`CSRF_FIELD`]) and the page's
    /// scripts (`X-Csrf-Token`).
    pub csrf: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

impl Viewer {
    /// The request is the user's own: `sent` (a form field or `X-Csrf-Token`) is the session's
    /// CSRF token. A 403 otherwise.
    pub fn check_csrf(&self, sent: Option<&str>) -> Result<(), Error> {
        match dashboard::csrf_matches(sent, &self.csrf) {
            true => Ok(()),
            false => Err(Error::Forbidden(
                "the request lacks this session's CSRF token".into(),
            )),
        }
    }
}

/// Why a page has no [`Viewer`].
#[derive(Debug)]
pub enum Rejection {
    /// Not signed in (or the session ended): off to sign in, and back here afterwards.
    SignIn { return_to: String },
    /// The database cannot be asked.
    Error(Error),
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        match self {
            Rejection::SignIn { return_to } => see_other(&sign_in_location(&return_to), None),
            Rejection::Error(e) => e.into_response(),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Viewer
where
    Pool: FromRef<S>,
{
    type Rejection = Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Rejection> {
        match <Viewer as OptionalFromRequestParts<S>>::from_request_parts(parts, state).await {
            Ok(Some(viewer)) => Ok(viewer),
            Ok(None) => Err(Rejection::SignIn {
                return_to: requested_path(parts),
            }),
            Err(e) => Err(Rejection::Error(e)),
        }
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for Viewer
where
    Pool: FromRef<S>,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Option<Self>, Error> {
        let pool = Pool::from_ref(state);
        let Some(row) = dashboard::find(&pool, &parts.headers).await? else {
            return Ok(None);
        };
        crate::telemetry::record_user(row.user_id);
        Ok(Some(Viewer {
            user_id: row.user_id,
            username: row.username,
            admin: row.admin,
            csrf: row.csrf,
            expires_at: row.expires_at,
        }))
    }
}

/// The path and query the request asked for, as the router first saw it.
fn requested_path(parts: &Parts) -> String {
    let uri = parts
        .extensions
        .get::<OriginalUri>()
        .map_or(&parts.uri, |o| &o.0);
    uri.path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned())
}

/// Starts a session for `user_id`: the row, and the `Set-Cookie` that hands its id to the
/// browser.
pub async fn begin(db: &Pool, site: &Site, user_id: i64) -> Result<HeaderValue, Error> {
    let id = dashboard::new_secret();
    let csrf = dashboard::new_secret();
    let mut conn = db.acquire().await?;
    db::sessions::create_session(
        &mut *conn,
        &dashboard::hash(&id),
        user_id,
        &csrf,
        site.session_lifetime(),
    )
    .await?;
    tracing::info!(user_id, "dashboard session started");
    Ok(session_cookie(site, &id, site.session_lifetime().as_secs()))
}

/// `Set-Cookie` of the session id `value`, for `max_age` seconds (0 clears it).
fn session_cookie(site: &Site, value: &str, max_age: u64) -> HeaderValue {
    let mut cookie =
        format!("{COOKIE_NAME}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax");
    if site.secure() {
        cookie.push_str("; Secure");
    }
    let mut value = HeaderValue::from_str(&cookie).expect("a session id is header-safe");
    value.set_sensitive(true);
    value
}

/// The `Set-Cookie` that removes the session cookie from the browser.
pub fn clear_cookie(site: &Site) -> HeaderValue {
    session_cookie(site, "", 0)
}

/// `303 See Other` to `location`, with a cookie to set; never cached.
pub fn see_other(location: &str, cookie: Option<HeaderValue>) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(location) {
        headers.insert(LOCATION, location);
    }
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(cookie) = cookie {
        headers.insert(SET_COOKIE, cookie);
    }
    response
}

/// `/-/sign-in`, with `return_to` when it is worth coming back to.
pub fn sign_in_location(return_to: &str) -> String {
    let mut location = super::sign_in::PATH.to_owned();
    if let Some(path) = safe_return_to(return_to).filter(|p| *p != "/") {
        location.push_str("?return_to=");
        location.extend(url::form_urlencoded::byte_serialize(path.as_bytes()));
    }
    location
}

/// `path` when it is a path of envlens itself, else `None`: a redirect after signing in never
/// leads to another site. Taken: an absolute path (`/...`) that is not protocol-relative
/// (`//host`, `/\host`), with no backslash, control character or space anywhere (browsers
/// drop or reinterpret those), not the sign-in pages themselves, and at most 2 KiB.
pub fn safe_return_to(path: &str) -> Option<&str> {
    let ok = path.starts_with('/')
        && !path.starts_with("//")
        && path.len() <= MAX_RETURN_TO
        && !path
            .chars()
            .any(|c| c == '\\' || c.is_control() || c.is_whitespace())
        && !path.starts_with("/-/sign-in")
        && !path.starts_with("/-/auth/");
    ok.then_some(path)
}

/// `POST /-/sign-out`: ends the session (its row deleted, the cookie cleared) and goes to the
/// sign-in page. The CSRF token is required: the form field [`CSRF_FIELD`] or `X-Csrf-Token`;
/// without it (or with another) the session stays and the answer is 403. Without a live
/// session there is nothing to end: the cookie is cleared all the same.
pub async fn sign_out(
    State(db): State<Pool>,
    State(site): State<Site>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let session = match dashboard::find(&db, &headers).await {
        Ok(session) => session,
        Err(e) => return e.into_response(),
    };
    let Some(session) = session else {
        return see_other(super::sign_in::PATH, Some(clear_cookie(&site)));
    };
    let sent = sent_csrf(&headers, &body);
    if !dashboard::csrf_matches(sent.as_deref(), &session.csrf) {
        return html::refusal(
            StatusCode::FORBIDDEN,
            "Not signed out",
            "The request did not carry this session's CSRF token, so it may not come from \
             envlens' own page. Sign out with the button of the dashboard.",
        );
    }
    let id = dashboard::cookie(&headers, COOKIE_NAME).unwrap_or_default();
    let ended = async {
        let mut conn = db.acquire().await?;
        db::sessions::delete_session(&mut *conn, &dashboard::hash(id)).await
    };
    if let Err(e) = ended.await {
        return e.into_response();
    }
    tracing::info!(user_id = session.user_id, "dashboard session ended");
    see_other(super::sign_in::PATH, Some(clear_cookie(&site)))
}

/// The CSRF token of a request: `X-Csrf-Token`, else the [`CSRF_FIELD`] of a form body.
pub fn sent_csrf(headers: &HeaderMap, body: &[u8]) -> Option<String> {
    if let Some(value) = headers.get(CSRF_HEADER) {
        return value.to_str().ok().map(str::to_owned);
    }
    let form = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';').next().is_some_and(|t| {
                t.trim()
                    .eq_ignore_ascii_case("application/x-www-form-urlencoded")
            })
        });
    if !form {
        return None;
    }
    url::form_urlencoded::parse(body)
        .find(|(name, _)| name == CSRF_FIELD)
        .map(|(_, value)| value.into_owned())
}

/// A hidden form field with the viewer's CSRF token, for a form that posts to envlens.
pub fn csrf_field(viewer: &Viewer) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<input type=\"hidden\" name=\"{CSRF_FIELD}\" value=\"{}\">",
        html::escape(&viewer.csrf)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_own_paths_are_returned_to() {
        for ok in [
            "/",
            "/groups/acme",
            "/groups/acme?tier=production#x",
            "/-/graphql-explorer",
        ] {
            assert_eq!(safe_return_to(ok), Some(ok), "{ok}");
        }
        for refused in [
            "",
            "https://evil.example/",
            "//evil.example/",
            "/\\evil.example/",
            "/\\/evil.example",
            "\\\\evil.example",
            "javascript:alert(1)",
            "/ok\r\nLocation: https://evil.example",
            "/\t/evil.example",
            " /x",
            "/-/sign-in?return_to=/x",
            "/-/auth/gitlab/callback",
            "evil.example",
        ] {
            assert_eq!(safe_return_to(refused), None, "{refused:?}");
        }
        assert_eq!(
            safe_return_to(&format!("/{}", "a".repeat(MAX_RETURN_TO))),
            None
        );
    }

    #[test]
    fn sign_in_locations_carry_the_page() {
        assert_eq!(sign_in_location("/"), "/-/sign-in");
        assert_eq!(sign_in_location("//evil.example"), "/-/sign-in");
        assert_eq!(
            sign_in_location("/groups/acme?tier=production&q=a%20b"),
            "/-/sign-in?return_to=%2Fgroups%2Facme%3Ftier%3Dproduction%26q%3Da%2520b"
        );
    }

    #[test]
    fn cookie_flags() {
        let plain = Site::new(
            "http://127.0.0.1:8080",
            super::super::DEFAULT_SESSION_LIFETIME,
        )
        .unwrap();
        let cookie = session_cookie(&plain, "abc", 60);
        assert_eq!(
            cookie.to_str().unwrap(),
            "envlens_session=abc; Path=/; Max-Age=60; HttpOnly; SameSite=Lax"
        );
        assert!(cookie.is_sensitive());
        let secure = Site::new(
            "https://envlens.example.com/",
            super::super::DEFAULT_SESSION_LIFETIME,
        )
        .unwrap();
        assert_eq!(
            clear_cookie(&secure).to_str().unwrap(),
            "envlens_session=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax; Secure"
        );
    }

    #[test]
    fn csrf_from_header_or_form() {
        let mut headers = HeaderMap::new();
        assert_eq!(sent_csrf(&headers, b"csrf=a"), None);
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded; charset=utf-8"),
        );
        assert_eq!(
            sent_csrf(&headers, b"x=1&csrf=a%2Bb").as_deref(),
            Some("a+b")
        );
        assert_eq!(sent_csrf(&headers, b"x=1").as_deref(), None);
        headers.insert(CSRF_HEADER, HeaderValue::from_static("h"));
        assert_eq!(sent_csrf(&headers, b"csrf=a").as_deref(), Some("h"));
    }
}
