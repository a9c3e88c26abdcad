//! Signing in (SPEC 9): the sign-in page, the one-time links of `envlens token --user <name>
//! --sign-in`, and "Sign in with GitLab".

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::header::CACHE_CONTROL;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

use super::html::{self, escape};
use super::session::{begin, safe_return_to, see_other, Viewer};
use super::Site;
use crate::auth::dashboard;
use crate::db;
use crate::db::pool::Pool;
use crate::error::Error;
use crate::gitlab::Instance;

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
    State(gitlab): State<Option<Arc<Instance>>>,
    Query(query): Query<ReturnTo>,
) -> Response {
    let return_to = query.path();
    if viewer.is_some() {
        return see_other(return_to, None);
    }
    let mut body = String::from("<h1>Sign in to envlens</h1>\n");
    if gitlab_sign_in(gitlab.as_deref()) {
        let mut href = String::from("/-/sign-in/gitlab");
        if return_to != "/" {
            href.push_str("?return_to=");
            href.extend(url::form_urlencoded::byte_serialize(return_to.as_bytes()));
        }
        body.push_str(&format!(
            "<p><a class=\"button\" href=\"{}\">Sign in with GitLab</a></p>\n",
            escape(&href)
        ));
    }
    body.push_str(
        "<p>Or ask for a one-time sign-in link on the machine envlens runs on: \
         <code>envlens token --user &lt;your GitLab username&gt; --sign-in</code> \
         prints one, valid for five minutes.</p>",
    );
    (
        [(CACHE_CONTROL, "no-store")],
        Html(html::page("Sign in", &body)),
    )
        .into_response()
}

/// `GET /-/sign-in/link/{token}`: a one-time link starts a session and goes to `/`. A link is
/// used up by its first use, valid or not.
pub async fn link(
    State(db): State<Pool>,
    State(site): State<Site>,
    Path(token): Path<String>,
) -> Response {
    let refused = || {
        html::refusal(
            StatusCode::FORBIDDEN,
            "This sign-in link does not work",
            "A sign-in link works once, for five minutes. Ask for a new one with \
             `envlens token --user <name> --sign-in`.",
        )
    };
    if !dashboard::is_secret(&token) {
        return refused();
    }
    let taken = async {
        let mut conn = db.acquire().await?;
        db::sessions::take_link(&mut *conn, &dashboard::hash(&token)).await
    };
    let user_id = match taken.await {
        Ok(Some(user_id)) => user_id,
        Ok(None) => return refused(),
        Err(e) => return e.into_response(),
    };
    match begin(&db, &site, user_id).await {
        Ok(cookie) => see_other("/", Some(cookie)),
        Err(e) => e.into_response(),
    }
}

/// A new sign-in link for `user_id`, as `envlens token --sign-in` prints it.
pub async fn create_link(db: &Pool, public_url: &str, user_id: i64) -> Result<String, Error> {
    let token = dashboard::new_secret();
    let mut conn = db.acquire().await?;
    db::sessions::create_link(&mut *conn, &dashboard::hash(&token), user_id, LINK_LIFETIME).await?;
    Ok(format!(
        "{}/-/sign-in/link/{token}",
        public_url.trim_end_matches('/')
    ))
}

/// `GET /-/sign-in/gitlab`: off to GitLab's authorization page.
pub async fn gitlab() -> Response {
    not_configured()
}

/// `GET /-/auth/gitlab/callback`: GitLab's answer.
pub async fn callback() -> Response {
    not_configured()
}

/// Whether "Sign in with GitLab" is offered.
fn gitlab_sign_in(_gitlab: Option<&Instance>) -> bool {
    false
}

fn not_configured() -> Response {
    html::refusal(
        StatusCode::NOT_FOUND,
        "Sign in with GitLab is not configured",
        "envlens' configuration names no GitLab OAuth application (gitlab.client_id). \
         Ask for a sign-in link with `envlens token --user <name> --sign-in`.",
    )
}
