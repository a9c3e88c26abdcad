//! Signing in (SPEC 9): the sign-in page, the one-time links of `envlens token --user <name>
//! --sign-in` (a GET shows whom it signs in; only the page's POST uses it), and "Sign in with
//! GitLab".

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::header::{CACHE_CONTROL, ORIGIN, REFERRER_POLICY, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

use super::html::{self, escape};
use super::session::{begin, safe_return_to, see_other, Viewer};
use super::Site;
use crate::auth::attempt::{self, Attempt, Unsealed};
use crate::auth::{dashboard, Keys};
use crate::db;
use crate::db::pool::Pool;
use crate::error::Error;
use crate::gitlab::oidc::SignInError;

/// The sign-in page.
pub const PATH: &str = "/-/sign-in";
/// Where GitLab sends the browser back to (the OAuth application's redirect URI).
pub const CALLBACK_PATH: &str = "/-/auth/gitlab/callback";
/// How long a sign-in link is valid.
pub const LINK_LIFETIME: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, Default, Deserialize)]
pub struct ReturnTo {
    #[serde(default)]
    return_to: Option<String>,
}

impl ReturnTo {
    /// The page to go to after signing in: `return_to` when it is envlens' own, else `/`.
    fn path(&self) -> &str {
        self.return_to
            .as_deref()
            .and_then(safe_return_to)
            .unwrap_or("/")
    }
}

/// `GET /-/sign-in`: "Sign in with GitLab" when GitLab is configured for it, otherwise how to
/// get a sign-in link. A signed-in user goes straight on.
pub async fn page(
    viewer: Option<Viewer>,
    State(site): State<Site>,
    Query(query): Query<ReturnTo>,
) -> Response {
    let return_to = query.path();
    if viewer.is_some() {
        return see_other(return_to, None);
    }
    let mut body = String::from("<h1>Sign in to envlens</h1>\n");
    if site.gitlab().is_some() {
        let mut href = String::from("/-/sign-in/gitlab");
        if return_to != "/" {
            href.push_str("?return_to=");
            href.extend(url::form_urlencoded::byte_serialize(return_to.as_bytes()));
        }
        body.push_str(&format!(
            "<p><a class=\"button primary\" href=\"{}\">Sign in with GitLab</a></p>\n",
            escape(&href)
        ));
    }
    body.push_str(if site.gitlab().is_some() {
        "<p>Or ask for a one-time sign-in link "
    } else {
        "<p>Ask for a one-time sign-in link "
    });
    body.push_str(
        "on the machine envlens runs on: \
         <code>envlens token --user &lt;your GitLab username&gt; --sign-in</code> \
         prints one, valid for five minutes.</p>",
    );
    (
        [(CACHE_CONTROL, "no-store")],
        Html(html::page("Sign in", &body)),
    )
        .into_response()
}

fn link_refused() -> Response {
    html::refusal(
        StatusCode::FORBIDDEN,
        "This sign-in link does not work",
        "A sign-in link works once, for five minutes. Ask for a new one with \
         `envlens token --user <name> --sign-in`.",
    )
}

/// `GET /-/sign-in/link/{token}`: a page that says whom the link signs in, with a button that
/// posts it. A GET spends nothing, so that a link preview (a chat application, a mail scanner)
/// that fetches the link leaves it working for the person it was meant for.
pub async fn link_page(State(db): State<Pool>, Path(token): Path<String>) -> Response {
    if !dashboard::is_secret(&token) {
        return link_refused();
    }
    let peeked = async {
        let mut conn = db.acquire().await?;
        db::sessions::peek_link(&mut *conn, &dashboard::hash(&token)).await
    };
    let username = match peeked.await {
        Ok(Some((_, username))) => username,
        Ok(None) => return link_refused(),
        Err(e) => return e.into_response(),
    };
    let body = format!(
        "<h1>Sign in to envlens</h1>\n\
         <p>This one-time link signs you in as <strong>{user}</strong>. It works once.</p>\n\
         <form method=\"post\" action=\"{LINK_PREFIX}{token}\">\
         <button class=\"primary\" type=\"submit\">Continue as {user}</button></form>",
        user = escape(&username),
    );
    (
        [
            (CACHE_CONTROL, "no-store"),
            // The token is in this page's address: no other site hears of it. (Not
            // `no-referrer`: its form's post would then carry `Origin: null`.)
            (REFERRER_POLICY, "same-origin"),
        ],
        Html(html::page("Sign in", &body)),
    )
        .into_response()
}

/// `POST /-/sign-in/link/{token}`: the link starts a session and goes to `/`. A link is used up
/// by its first post, valid or not. A post another site's page sent (its `Origin` is not
/// envlens') is refused: it would sign this browser in as the link's owner.
pub async fn link(
    State(db): State<Pool>,
    State(site): State<Site>,
    Path(token): Path<String>,
    headers: HeaderMap,
) -> Response {
    let foreign = headers
        .get(ORIGIN)
        .is_some_and(|origin| !site.is_own_origin(origin));
    if foreign {
        return html::refusal(
            StatusCode::FORBIDDEN,
            "This sign-in did not start here",
            "A sign-in link is used from its own page, on envlens' own address.",
        );
    }
    if !dashboard::is_secret(&token) {
        return link_refused();
    }
    let taken = async {
        let mut conn = db.acquire().await?;
        db::sessions::take_link(&mut *conn, &dashboard::hash(&token)).await
    };
    let user_id = match taken.await {
        Ok(Some(user_id)) => user_id,
        Ok(None) => return link_refused(),
        Err(e) => return e.into_response(),
    };
    match begin(&db, &site, user_id).await {
        Ok(cookie) => see_other("/", Some(cookie)),
        Err(e) => e.into_response(),
    }
}

/// Where a sign-in link's token follows.
pub const LINK_PREFIX: &str = "/-/sign-in/link/";

/// A new sign-in link for `user_id`, as `envlens token --sign-in` prints it.
pub async fn create_link(db: &Pool, public_url: &str, user_id: i64) -> Result<String, Error> {
    let token = dashboard::new_secret();
    let mut conn = db.acquire().await?;
    db::sessions::create_link(&mut *conn, &dashboard::hash(&token), user_id, LINK_LIFETIME).await?;
    Ok(format!(
        "{}{LINK_PREFIX}{token}",
        public_url.trim_end_matches('/')
    ))
}

/// The cookies that carry an attempt of "Sign in with GitLab" ([`crate::auth::attempt`]), one
/// per attempt: `envlens_sign_in_<16 hex digits of the state's SHA-256>=<the sealed attempt>`.
/// A callback whose `state` has no such cookie, or one this server did not seal for that
/// state, is refused (another's code planted in this browser would sign it in as someone
/// else); two tabs signing in at once each keep their own. They are sent to `/-/auth/` only
/// and live as long as the attempt.
const ATTEMPT_COOKIE_PREFIX: &str = "envlens_sign_in_";

/// The name of the cookie of the attempt of `state`.
fn attempt_cookie_name(state: &str) -> String {
    let mut name = String::from(ATTEMPT_COOKIE_PREFIX);
    for byte in &dashboard::hash(state)[..8] {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

/// `GET /-/sign-in/gitlab`: off to GitLab's authorization page, with a new `state`; the
/// attempt (state, nonce, PKCE verifier, the page to return to) goes to this browser, sealed,
/// and nothing to the server.
pub async fn gitlab(
    State(site): State<Site>,
    State(keys): State<Arc<Keys>>,
    Query(query): Query<ReturnTo>,
) -> Response {
    let Some(oidc) = site.gitlab() else {
        return not_configured();
    };
    let state = dashboard::new_secret();
    let started = match oidc.start(&redirect_uri(&site), &state).await {
        Ok(started) => started,
        Err(e) => return sign_in_error(e),
    };
    let lifetime = attempt::LIFETIME.as_secs();
    let attempt = Attempt {
        state: state.clone(),
        nonce: started.nonce,
        pkce_verifier: started.pkce_verifier,
        return_to: query.path().to_owned(),
        expires_at: chrono::Utc::now().timestamp() + lifetime as i64,
    };
    let sealed = attempt.seal(keys.attempts());
    let cookie = attempt_cookie(&site, &state, &sealed, lifetime);
    see_other(&started.authorize_url, Some(cookie))
}

fn redirect_uri(site: &Site) -> String {
    format!("{}{CALLBACK_PATH}", site.public_url())
}

/// `Set-Cookie` of the attempt of `state`, with `value` (empty and 0 seconds: cleared).
fn attempt_cookie(site: &Site, state: &str, value: &str, max_age: u64) -> HeaderValue {
    let mut cookie = format!(
        "{}={value}; Path=/-/auth/; Max-Age={max_age}; HttpOnly; SameSite=Lax",
        attempt_cookie_name(state)
    );
    if site.secure() {
        cookie.push_str("; Secure");
    }
    HeaderValue::from_str(&cookie).expect("a state is header-safe")
}

/// GitLab's redirect back: `code` and `state`, or `error` (the user said no).
#[derive(Debug, Deserialize)]
pub struct Callback {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    error_description: Option<String>,
}

/// `GET /-/auth/gitlab/callback`: the attempt of `state` (this browser's, not expired; its
/// code is good once at GitLab, and its cookie is cleared) ends: the code is traded for GitLab's tokens, the ID token checked, and its user
/// (`sub`, a GitLab user id) looked up in the mirror; a known user is signed in and sent to
/// the page they came for, anyone else gets a page that says why, and no session.
pub async fn callback(
    State(db): State<Pool>,
    State(site): State<Site>,
    State(keys): State<Arc<Keys>>,
    Query(query): Query<Callback>,
    headers: HeaderMap,
) -> Response {
    let Some(oidc) = site.gitlab() else {
        return not_configured();
    };
    // This attempt's cookie goes, whatever the outcome.
    let clear = query
        .state
        .as_deref()
        .filter(|state| dashboard::is_secret(state))
        .map(|state| attempt_cookie(&site, state, "", 0));
    let refused = |status, title: &str, message: &str| {
        let mut response = html::refusal(status, title, message);
        if let Some(clear) = &clear {
            response.headers_mut().append(SET_COOKIE, clear.clone());
        }
        response
    };
    if let Some(error) = &query.error {
        let why = match &query.error_description {
            Some(description) => format!("GitLab answered {error}: {description}"),
            None => format!("GitLab answered {error}."),
        };
        return refused(StatusCode::FORBIDDEN, "GitLab did not sign you in", &why);
    }
    let (Some(code), Some(state)) = (&query.code, &query.state) else {
        return refused(
            StatusCode::BAD_REQUEST,
            "Not a sign-in",
            "GitLab sends the browser here with a code and a state; this request has neither.",
        );
    };
    // This browser's attempt of this `state`: sealed by this server, not expired.
    let carried = dashboard::is_secret(state)
        .then(|| dashboard::cookie(&headers, &attempt_cookie_name(state)))
        .flatten()
        .map(|sealed| Attempt::open(sealed, keys.attempts(), chrono::Utc::now().timestamp()));
    let attempt = match carried {
        Some(Ok(attempt)) if dashboard::csrf_matches(Some(state), &attempt.state) => attempt,
        Some(Err(Unsealed::Expired)) => {
            return refused(
                StatusCode::FORBIDDEN,
                "This sign-in has expired",
                "A sign-in with GitLab must be completed within ten minutes. \
                 Start again from the sign-in page.",
            )
        }
        _ => {
            return refused(
                StatusCode::FORBIDDEN,
                "This sign-in did not start here",
                "The answer from GitLab does not belong to a sign-in this browser started. \
                 Start again from the sign-in page.",
            )
        }
    };
    let user = match oidc
        .finish(
            &redirect_uri(&site),
            code,
            &attempt.pkce_verifier,
            &attempt.nonce,
        )
        .await
    {
        Ok(user) => user,
        Err(e) => {
            let mut response = sign_in_error(e);
            if let Some(clear) = clear {
                response.headers_mut().append(SET_COOKIE, clear);
            }
            return response;
        }
    };
    // A user GitLab signed in whom the mirror lacks is added from their profile (SPEC 13),
    // with no memberships; one it has takes the profile's external flag (GitLab's word about
    // oneself, which a sync with a token that is no administrator's lacks, and which took
    // them as external meanwhile). Only an active user is let in.
    let known = async {
        let mut conn = db.acquire().await?;
        if let Some(profile) = &user.profile {
            if !db::identity::user_mirrored(&mut *conn, user.id).await? {
                crate::auth::vouched::add_profile(&mut conn, user.id, profile).await?;
            } else if let Some(external) = profile.external {
                db::identity::set_user_external(&mut *conn, user.id, external).await?;
            }
        }
        db::identity::find_user(&mut *conn, user.id).await
    };
    match known.await {
        Ok(Some(_)) => {}
        Ok(None) | Err(Error::Unauthorized(_)) => {
            let who = match &user.profile {
                Some(profile) => format!("@{} (GitLab user {})", profile.username, user.id),
                None => format!("GitLab user {}", user.id),
            };
            tracing::info!(
                gitlab_user = user.id,
                "sign-in refused: not an active user of the identity mirror"
            );
            return refused(
                StatusCode::FORBIDDEN,
                "envlens does not let you in",
                &format!(
                    "GitLab signed you in as {who}, but envlens' copy of GitLab's users does \
                     not have this account as an active user (blocked, deactivated, or not \
                     known yet), so it cannot tell what you may see. Ask your administrator if \
                     this is wrong."
                ),
            );
        }
        Err(e) => return e.into_response(),
    }
    let session = match begin(&db, &site, user.id).await {
        Ok(cookie) => cookie,
        Err(e) => return e.into_response(),
    };
    let return_to = safe_return_to(&attempt.return_to).unwrap_or("/");
    let mut response = see_other(return_to, Some(session));
    if let Some(clear) = clear {
        response.headers_mut().append(SET_COOKIE, clear);
    }
    response
}

/// A failed sign-in with GitLab: 403 when GitLab or its token said no, 503 when GitLab cannot
/// be asked.
fn sign_in_error(e: SignInError) -> Response {
    match e {
        SignInError::Refused(why) => {
            tracing::info!(reason = %why, "sign-in with GitLab refused");
            html::refusal(StatusCode::FORBIDDEN, "GitLab did not sign you in", &why)
        }
        SignInError::Unavailable(why) => {
            tracing::warn!(reason = %why, "sign-in with GitLab failed");
            html::refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "GitLab cannot be reached",
                "envlens cannot complete the sign-in with GitLab now. Try again in a moment.",
            )
        }
    }
}

fn not_configured() -> Response {
    html::refusal(
        StatusCode::NOT_FOUND,
        "Sign in with GitLab is not configured",
        "envlens' configuration names no GitLab OAuth application (gitlab.client_id). \
         Ask for a sign-in link with `envlens token --user <name> --sign-in`.",
    )
}
