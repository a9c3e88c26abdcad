//! What GitLab decides, as pure functions over loaded rows: an agent's configuration and who it
//! authorizes (`ci_access`, `user_access`), which deployment status wins, and the validation of
//! the names and paths GitLab hands over; and the instance itself, as a third party reaches it
//! (its API, its CI/CD ID tokens).

pub mod access;
pub mod agent_config;
pub mod api;
pub mod deployment_status;
pub mod hook_scope;
pub mod id_token;
pub mod oidc;
pub mod push;
pub mod rest;
pub mod tokens;
pub mod users;
pub mod validate;

/// The GitLab instance envlens runs beside, when the configuration file names one.
pub struct Instance {
    pub api: api::GitLab,
    pub id_tokens: id_token::IdTokens,
    /// GitLab's answers about its tokens sent to envlens as bearer tokens.
    pub user_tokens: tokens::UserTokens,
    /// When each signed-in user's state was last read from GitLab.
    pub state_reads: users::StateReads,
}

impl Instance {
    /// From `gitlab.url` (and its token file), for ID tokens addressed to `public_url`.
    pub fn load(
        settings: &crate::config::file::GitLabSettings,
        public_url: &str,
        metrics: std::sync::Arc<crate::telemetry::Metrics>,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let token = match &settings.token_file {
            Some(path) => Some(api::Token::new(
                &std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read gitlab.token_file {}", path.display()))?,
            )),
            None => None,
        };
        let api = api::GitLab::new(&settings.url, token, metrics, api::Policy::default())?;
        Ok(Instance::new(
            api,
            public_url,
            settings.token_cache,
            settings.client_id.clone(),
        ))
    }

    /// Through `api`; GitLab's word on users and their tokens holds for `token_cache`, and
    /// `client_id` is envlens' own OAuth application (its tokens pass every use).
    pub fn new(
        api: api::GitLab,
        public_url: &str,
        token_cache: std::time::Duration,
        client_id: Option<String>,
    ) -> Self {
        Instance {
            id_tokens: id_token::IdTokens::new(api.clone(), public_url),
            user_tokens: tokens::UserTokens::new(token_cache, client_id),
            state_reads: users::StateReads::new(token_cache),
            api,
        }
    }
}
