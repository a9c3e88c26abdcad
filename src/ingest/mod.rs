//! What GitLab pushes into envlens: the identity mirror, agents and their configuration,
//! deployments, and the hooks that carry them.

pub mod agents;
pub mod ci_deployments;
pub mod deployments;
pub mod followups;
pub mod hooks;
pub mod identity;
pub mod pull;
pub mod sync;
