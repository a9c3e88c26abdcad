//! A signed-in user's access to an agent's cluster (`user_access`, SPEC 5.2 and 5.3): the rows
//! the decision needs, the decision itself (pure, in [`crate::gitlab::access`]), and the Kubernetes
//! impersonation headers that carry it to the cluster.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use sqlx::PgExecutor;

use crate::auth::Via;
use crate::db::agents::{self, Agent};
use crate::error::Result;
use crate::gitlab::access::{self, AccessAs, UserAuthorization};

/// How the user proved who they are, as KAS reports it in `agent.gitlab.com/access_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessType {
    /// The `_gitlab_kas` cookie of the browser.
    SessionCookie,
    /// A bearer token: scripts, like GitLab's personal access tokens.
    PersonalAccessToken,
}

impl AccessType {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessType::SessionCookie => "session_cookie",
            AccessType::PersonalAccessToken => "personal_access_token",
        }
    }
}

impl From<Via> for AccessType {
    fn from(via: Via) -> Self {
        match via {
            Via::Cookie => AccessType::SessionCookie,
            Via::Bearer => AccessType::PersonalAccessToken,
        }
    }
}

/// A granted `user_access`: who, on which agent, and as whom requests reach the cluster.
#[derive(Debug, Clone)]
pub struct Grant {
    pub agent: Agent,
    pub username: String,
    pub authorization: UserAuthorization,
    /// The impersonation headers for each [`AccessType`], made on first use: a cached grant
    /// serves many proxied requests, and building them costs a dozen allocations.
    impersonation: OnceLock<[HeaderMap; 2]>,
}

/// The user's `user_access` to the agent; `None` for a refusal, an unknown agent or an unknown
/// user alike, so that nobody can tell them apart.
pub async fn authorize(
    db: impl PgExecutor<'_>,
    agent_id: i64,
    user_id: i64,
) -> Result<Option<Grant>> {
    Ok(agents::user_access(db, agent_id, user_id)
        .await?
        .and_then(decide))
}

/// [`authorize`] of each of `agent_ids`, in one statement; an agent missing from the answer is
/// refused, as [`authorize`] refuses it.
pub async fn authorize_all(
    db: impl PgExecutor<'_>,
    agent_ids: &[i64],
    user_id: i64,
) -> Result<HashMap<i64, Option<Grant>>> {
    let mut decided: HashMap<i64, Option<Grant>> = agent_ids.iter().map(|id| (*id, None)).collect();
    for rows in agents::user_access_of(db, agent_ids, user_id).await? {
        if let Some(slot) = decided.get_mut(&rows.agent.id) {
            *slot = decide(rows);
        }
    }
    Ok(decided)
}

/// The decision over one agent's rows.
fn decide(rows: agents::UserAccessRows) -> Option<Grant> {
    let (access_as, entries) = agents::user_access_entries(&rows.entries);
    access::user_access(rows.admin, access_as, &entries).map(|authorization| Grant {
        agent: rows.agent,
        username: rows.username,
        authorization,
        impersonation: OnceLock::new(),
    })
}

/// Decisions of the last few seconds, per (user, agent), as KAS caches GitLab's answers: a
/// browser watching a page sends many requests, and each would otherwise cost a statement.
/// A membership or configuration change therefore takes effect within `ttl`.
pub struct GrantCache {
    ttl: Duration,
    entries: Mutex<Decisions>,
}

/// (user, agent) -> when decided, and the grant or the refusal.
type Decisions = HashMap<(i64, i64), (Instant, Option<Arc<Grant>>)>;

/// Enough for every active user of a large instance; past it the cache starts over.
const MAX_CACHED: usize = 10_000;

impl GrantCache {
    pub fn new(ttl: Duration) -> Self {
        GrantCache {
            ttl,
            entries: Mutex::default(),
        }
    }

    /// How long a decision is reused: a subscription asks again this often.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// [`authorize`], answered from the cache when the decision is recent. Errors are not kept.
    pub async fn authorize(
        &self,
        db: impl PgExecutor<'_>,
        agent_id: i64,
        user_id: i64,
    ) -> Result<Option<Arc<Grant>>> {
        if let Some(grant) = self.cached(agent_id, user_id) {
            return Ok(grant);
        }
        let grant = authorize(db, agent_id, user_id).await?.map(Arc::new);
        self.keep(user_id, [(agent_id, grant.clone())]);
        Ok(grant)
    }

    /// [`GrantCache::authorize`] of each of `agent_ids`, in their order: those not decided
    /// recently in one statement ([`authorize_all`]), not one per agent.
    pub async fn authorize_all(
        &self,
        db: impl PgExecutor<'_>,
        agent_ids: &[i64],
        user_id: i64,
    ) -> Result<Vec<Option<Arc<Grant>>>> {
        let mut grants: Vec<Option<Option<Arc<Grant>>>> = agent_ids
            .iter()
            .map(|id| self.cached(*id, user_id))
            .collect();
        let missing: Vec<i64> = agent_ids
            .iter()
            .zip(&grants)
            .filter(|(_, g)| g.is_none())
            .map(|(id, _)| *id)
            .collect();
        if !missing.is_empty() {
            let decided: HashMap<i64, Option<Arc<Grant>>> = authorize_all(db, &missing, user_id)
                .await?
                .into_iter()
                .map(|(id, g)| (id, g.map(Arc::new)))
                .collect();
            for (id, grant) in agent_ids.iter().zip(grants.iter_mut()) {
                if grant.is_none() {
                    *grant = Some(decided.get(id).cloned().flatten());
                }
            }
            self.keep(user_id, decided);
        }
        Ok(grants.into_iter().map(Option::flatten).collect())
    }

    fn keep(&self, user_id: i64, decided: impl IntoIterator<Item = (i64, Option<Arc<Grant>>)>) {
        let mut entries = self.lock();
        let now = Instant::now();
        for (agent_id, grant) in decided {
            if entries.len() >= MAX_CACHED {
                entries.clear();
            }
            entries.insert((user_id, agent_id), (now, grant));
        }
    }

    /// The recent decision for the user on the agent, if there is one: then no connection is
    /// needed.
    pub fn cached(&self, agent_id: i64, user_id: i64) -> Option<Option<Arc<Grant>>> {
        let entries = self.lock();
        let (at, grant) = entries.get(&(user_id, agent_id))?;
        (at.elapsed() < self.ttl).then(|| grant.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Decisions> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Grant {
    /// The `Impersonate-*` headers for `access_as: {user: {}}` (none for `{agent: {}}`): user
    /// `gitlab:user:<username>`, groups `gitlab:user` then every role of every qualifying
    /// project and group, and the `agent.gitlab.com/*` extras, as KAS sends them.
    pub fn impersonation(&self, access_type: AccessType) -> HeaderMap {
        self.impersonation_headers(access_type).clone()
    }

    /// [`Grant::impersonation`], borrowed.
    pub fn impersonation_headers(&self, access_type: AccessType) -> &HeaderMap {
        let [cookie, token] = self.impersonation.get_or_init(|| {
            [
                self.build_impersonation(AccessType::SessionCookie),
                self.build_impersonation(AccessType::PersonalAccessToken),
            ]
        });
        match access_type {
            AccessType::SessionCookie => cookie,
            AccessType::PersonalAccessToken => token,
        }
    }

    fn build_impersonation(&self, access_type: AccessType) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if self.authorization.access_as != AccessAs::User {
            return headers;
        }
        let mut add = |name: HeaderName, value: String| {
            // Usernames and ids are ASCII; a value that is not is left out rather than mangled.
            if let Ok(value) = HeaderValue::try_from(value) {
                headers.append(name, value);
            }
        };
        add(
            HeaderName::from_static("impersonate-user"),
            format!("gitlab:user:{}", self.username),
        );
        let group = HeaderName::from_static("impersonate-group");
        add(group.clone(), "gitlab:user".to_owned());
        let auth = &self.authorization;
        for (prefix, entries) in [("project", &auth.projects), ("group", &auth.groups)] {
            for (id, roles) in entries {
                for role in roles {
                    add(group.clone(), format!("gitlab:{prefix}_role:{id}:{role}"));
                }
            }
        }
        // Header names cannot hold `/`: Kubernetes percent-decodes the extra's key.
        let extras = [
            ("id", self.agent.id.to_string()),
            ("username", self.username.clone()),
            ("config_project_id", self.agent.project_id.to_string()),
            ("access_type", access_type.as_str().to_owned()),
        ];
        for (key, value) in extras {
            add(
                HeaderName::from_bytes(
                    format!("impersonate-extra-agent.gitlab.com%2f{key}").as_bytes(),
                )
                .expect("a valid header name"),
                value,
            );
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(access_as: AccessAs) -> Grant {
        Grant {
            agent: Agent {
                id: 7,
                project_id: 5,
                name: "prod".into(),
                project_full_path: "ops/agents".into(),
            },
            username: "alice".into(),
            authorization: UserAuthorization {
                access_as,
                projects: vec![(42, vec!["guest", "planner", "reporter", "developer"])],
                groups: vec![(3, vec!["guest"])],
            },
            impersonation: OnceLock::new(),
        }
    }

    fn values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
        headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn impersonates_the_user_with_roles_and_extras() {
        let grant = grant(AccessAs::User);
        let h = grant.impersonation(AccessType::SessionCookie);
        assert_eq!(values(&h, "impersonate-user"), ["gitlab:user:alice"]);
        assert_eq!(
            values(&h, "impersonate-group"),
            [
                "gitlab:user",
                "gitlab:project_role:42:guest",
                "gitlab:project_role:42:planner",
                "gitlab:project_role:42:reporter",
                "gitlab:project_role:42:developer",
                "gitlab:group_role:3:guest",
            ]
        );
        assert_eq!(values(&h, "impersonate-extra-agent.gitlab.com%2fid"), ["7"]);
        assert_eq!(
            values(&h, "impersonate-extra-agent.gitlab.com%2fusername"),
            ["alice"]
        );
        assert_eq!(
            values(&h, "impersonate-extra-agent.gitlab.com%2fconfig_project_id"),
            ["5"]
        );
        assert_eq!(
            values(&h, "impersonate-extra-agent.gitlab.com%2faccess_type"),
            ["session_cookie"]
        );
        assert_eq!(h.len(), 1 + 6 + 4);
        // The same grant, made once for each way of signing in.
        let token = grant.impersonation_headers(AccessType::PersonalAccessToken);
        assert_eq!(
            values(token, "impersonate-extra-agent.gitlab.com%2faccess_type"),
            ["personal_access_token"]
        );
        assert_eq!(
            values(
                grant.impersonation_headers(AccessType::SessionCookie),
                "impersonate-extra-agent.gitlab.com%2faccess_type"
            ),
            ["session_cookie"]
        );
    }

    #[test]
    fn the_agent_identity_sends_no_impersonation() {
        assert!(grant(AccessAs::Agent)
            .impersonation(AccessType::SessionCookie)
            .is_empty());
    }
}
