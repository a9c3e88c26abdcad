//! Users GitLab vouches for (SPEC 13, "User state"): a user whose GitLab token or GitLab
//! sign-in checks out but whom the mirror lacks is added from GitLab's own profile, with no
//! memberships (they see what any user sees until the hooks or the sync bring theirs); and the
//! state of a signed-in user is read again from GitLab at most every `gitlab.token_cache`, so
//! that a user blocked in GitLab is refused here even before a hook or a sync says so.

use sqlx::PgConnection;

use crate::db;
use crate::db::pool::Pool;
use crate::error::Error;
use crate::gitlab::users::{self, Profile};
use crate::gitlab::Instance;
use crate::telemetry::RequestId;

/// Makes sure the mirror has the user `user_id`, whose `token` GitLab just vouched for: from
/// `GET /user` with the token, else (a token that may not read it) `GET /users/:id` with
/// envlens' own token. Refused when GitLab's profile is of someone else or cannot be had.
pub async fn mirror_token_user(
    pool: &Pool,
    gitlab: &Instance,
    token: &str,
    user_id: i64,
    request_id: Option<&RequestId>,
) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    if db::identity::user_mirrored(&mut *conn, user_id).await? {
        return Ok(());
    }
    drop(conn);
    let unavailable = |e: crate::gitlab::api::ApiError| Error::GitLabUnavailable(e.to_string());
    let mut profile = users::own_profile(&gitlab.api, token, request_id)
        .await
        .map_err(unavailable)?;
    if profile.is_none() && gitlab.api.has_token() {
        profile = users::profile(&gitlab.api, user_id, request_id)
            .await
            .map_err(unavailable)?;
    }
    let Some(profile) = profile else {
        return Err(Error::Unauthorized(
            "unknown user: envlens does not know the token's user, and GitLab does not show \
             it their profile"
                .into(),
        ));
    };
    let mut conn = pool.acquire().await?;
    add_profile(&mut conn, user_id, &profile).await
}

/// Adds the user of `profile` (whose id must be `user_id`) unless the mirror has them.
pub async fn add_profile(
    conn: &mut PgConnection,
    user_id: i64,
    profile: &Profile,
) -> Result<(), Error> {
    if profile.id != user_id || profile.username.trim().is_empty() {
        return Err(Error::Unauthorized(
            "GitLab's profile is not of the user it vouched for".into(),
        ));
    }
    match db::identity::add_vouched_user(conn, user_id, &profile.username, &profile.state()).await {
        Ok(()) => {
            tracing::info!(
                gitlab_user = user_id,
                "user added to the mirror as GitLab vouched for them"
            );
            Ok(())
        }
        // Another user holds the username in the mirror: it missed a rename. Not guessed at.
        Err(Error::Conflict(why)) => Err(Error::Unauthorized(format!("unknown user: {why}"))),
        Err(e) => Err(e),
    }
}

/// Reads the state of the signed-in user `user_id` from GitLab again when it is due
/// (`gitlab.token_cache`), and records it. Best effort: GitLab away leaves the mirror's state
/// as it is (the hooks and the sync still keep it), and never fails the request.
pub async fn refresh_state(
    pool: &Pool,
    gitlab: &Instance,
    user_id: i64,
    request_id: Option<&RequestId>,
) {
    if !gitlab.state_reads.due(user_id) {
        return;
    }
    let profile = match users::profile(&gitlab.api, user_id, request_id).await {
        Ok(Some(profile)) if profile.id == user_id => profile,
        // GitLab has no such user: not guessed at here; the sync removes deleted users.
        Ok(_) => return,
        Err(e) => {
            tracing::warn!(gitlab_user = user_id, error = %e, "cannot read the user's state from GitLab");
            return;
        }
    };
    let recorded = async {
        let mut conn = pool.acquire().await?;
        db::identity::set_user_state(&mut *conn, user_id, &profile.state()).await
    };
    match recorded.await {
        Ok(true) => tracing::info!(
            gitlab_user = user_id,
            state = profile.state().state,
            "the user's state changed in GitLab"
        ),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(gitlab_user = user_id, error = %e, "cannot record the user's state")
        }
    }
}
