//! What GitLab decides, as pure functions over loaded rows: an agent's configuration and who it
//! authorizes (`ci_access`, `user_access`), which deployment status wins, and the validation of
//! the names and paths GitLab hands over.

pub mod access;
pub mod agent_config;
pub mod api;
pub mod deployment_status;
pub mod id_token;
pub mod validate;
