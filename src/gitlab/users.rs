//! GitLab's users as envlens asks about them (SPEC 13, "User state"): the profile of a token's
//! own user (`GET /api/v4/user`, to add a user GitLab vouches for that the mirror lacks), a
//! user's state by id (`GET /api/v4/users/:id`), whether envlens' own token is an
//! administrator's (which decides what the sync may take from `GET /users`), and when a
//! signed-in user's state is due to be read again (at most every `gitlab.token_cache`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde::Deserialize;

use super::api::{ApiError, GitLab, Token};
use super::validate;
use crate::db::identity::UserState;
use crate::telemetry::RequestId;

/// Users whose last re-read is remembered; past it the memory starts afresh (a few more reads).
const MAX_REMEMBERED: usize = 100_000;

/// A user as `GET /user` and `GET /users/:id` answer (`external` only to an administrator, or
/// about oneself).
#[derive(Debug, Clone, Deserialize)]
pub struct Profile {
    pub id: i64,
    pub username: String,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub external: Option<bool>,
    /// Only in an administrator's answers (GitLab's `UserWithAdmin`); absent otherwise.
    #[serde(default)]
    pub is_admin: Option<bool>,
}

impl Profile {
    /// The state the mirror keeps: an answer without one is no active user.
    pub fn state(&self) -> UserState {
        UserState {
            state: validate::user_state(self.state.as_deref().unwrap_or("unknown")),
            external: self.external,
        }
    }
}

/// The user of `token`, from `GET /user`; `None` when the token may not read it (a
/// `k8s_proxy`-only token: 403) or GitLab refuses it.
pub async fn own_profile(
    api: &GitLab,
    token: &str,
    request_id: Option<&RequestId>,
) -> Result<Option<Profile>, ApiError> {
    match api
        .get_as("/user", "/api/v4/user", &Token::new(token), request_id)
        .await
    {
        Ok(profile) => Ok(Some(profile)),
        Err(ApiError::Unauthorized { .. }) => Ok(None),
        Err(ApiError::Status { status, .. }) if status == StatusCode::FORBIDDEN => Ok(None),
        Err(e) => Err(e),
    }
}

/// The user `id`, from `GET /users/:id` with envlens' own token; `None` when GitLab has no
/// such user (404).
pub async fn profile(
    api: &GitLab,
    id: i64,
    request_id: Option<&RequestId>,
) -> Result<Option<Profile>, ApiError> {
    api.get_optional("/users/:id", &format!("/api/v4/users/{id}"), request_id)
        .await
}

/// Whether envlens' own token (`gitlab.token_file`) is an administrator's: its `GET /user`
/// says `is_admin: true`. GitLab shows `is_admin`, and the `external` flag of others, only to
/// administrators, so anything else (a regular user, a group or project token's bot, a token
/// that may not read `/user`) is no administrator's: the sync then takes no user from
/// `GET /users` (SPEC 13: an unknown `external` flag must not open internal projects).
pub async fn own_token_is_admin(
    api: &GitLab,
    request_id: Option<&RequestId>,
) -> Result<bool, ApiError> {
    match api
        .get_optional::<Profile>("/user", "/api/v4/user", request_id)
        .await
    {
        Ok(profile) => Ok(profile.and_then(|p| p.is_admin) == Some(true)),
        Err(ApiError::Status { status, .. }) if status == StatusCode::FORBIDDEN => Ok(false),
        Err(e) => Err(e),
    }
}

/// When each signed-in user's state was last read from GitLab.
pub struct StateReads {
    every: Duration,
    last: Mutex<HashMap<i64, Instant>>,
}

impl StateReads {
    pub fn new(every: Duration) -> Self {
        StateReads {
            every,
            last: Mutex::default(),
        }
    }

    /// Whether the user's state is to be read again now; if so, it counts as read.
    pub fn due(&self, user_id: i64) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last
            .get(&user_id)
            .is_some_and(|at| at.elapsed() < self.every)
        {
            return false;
        }
        if last.len() >= MAX_REMEMBERED {
            let every = self.every;
            last.retain(|_, at| at.elapsed() < every);
            if last.len() >= MAX_REMEMBERED {
                last.clear();
            }
        }
        last.insert(user_id, Instant::now());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_is_read_again_only_after_its_interval() {
        let reads = StateReads::new(Duration::from_secs(60));
        assert!(reads.due(7));
        assert!(!reads.due(7));
        assert!(reads.due(8));
        let reads = StateReads::new(Duration::ZERO);
        assert!(reads.due(7));
        assert!(reads.due(7));
    }

    #[test]
    fn a_profile_without_a_state_is_not_active() {
        let p: Profile = serde_json::from_str(r#"{"id": 7, "username": "dev"}"#).unwrap();
        assert_eq!(p.state().state, "unknown");
        let p: Profile = serde_json::from_str(
            r#"{"id": 7, "username": "dev", "state": "blocked", "external": true}"#,
        )
        .unwrap();
        assert_eq!(
            p.state(),
            UserState {
                state: "blocked".into(),
                external: Some(true)
            }
        );
    }
}
