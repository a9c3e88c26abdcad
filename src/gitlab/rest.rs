//! GitLab's REST answers as its API documentation shows them (`doc/api/groups.md`,
//! `projects.md`, `members.md`, `users.md`, `cluster_agents.md`, `environments.md`,
//! `branches.md`, `tags.md`), reduced to the keys envlens reads; every other key is ignored. And
//! the one decision made over them here: whether an environment's agent and namespace are a
//! given deployment's (SPEC 12.2).

use serde::Deserialize;

/// `GET /groups`, `/groups/:id`, `/groups/:id/descendant_groups`.
#[derive(Debug, Clone, Deserialize)]
pub struct Group {
    pub id: i64,
    pub full_path: String,
}

/// `GET /projects`, `/groups/:id/projects`.
#[derive(Debug, Clone, Deserialize)]
pub struct Project {
    pub id: i64,
    pub path_with_namespace: String,
    /// `private`, `internal` or `public`.
    #[serde(default)]
    pub visibility: Option<String>,
    /// `None` for a project with an empty repository.
    #[serde(default)]
    pub default_branch: Option<String>,
}

/// `GET /groups/:id/members`, `/projects/:id/members` (direct members only).
#[derive(Debug, Clone, Deserialize)]
pub struct Member {
    pub id: i64,
    pub username: String,
    pub access_level: i32,
    /// The user's state (`active`, `blocked`, ...), as the members API shows it.
    #[serde(default)]
    pub state: Option<String>,
}

/// `GET /users` (with an administrator's token, `is_admin` is there).
#[derive(Debug, Clone, Deserialize)]
pub struct User {
    pub id: i64,
    pub username: String,
    #[serde(default)]
    pub is_admin: Option<bool>,
    /// `active`, `blocked`, `deactivated`, `banned`, `blocked_pending_approval`,
    /// `ldap_blocked`, ...: only an active user is let in (SPEC 13).
    #[serde(default)]
    pub state: Option<String>,
    /// External users read internal projects only where they are members.
    #[serde(default)]
    pub external: Option<bool>,
}

/// `GET /projects/:id/cluster_agents`, and an environment's `cluster_agent`.
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterAgent {
    pub id: i64,
    pub name: String,
    pub config_project: ConfigProject,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ConfigProject {
    pub id: i64,
    pub path_with_namespace: String,
}

/// `GET /projects/:id/environments` and `/projects/:id/environments/:environment_id`; the
/// latter adds `last_deployment`, and since GitLab 17.5 both carry `cluster_agent` and
/// `kubernetes_namespace` (GitLab 17.7: `flux_resource_path`).
#[derive(Debug, Clone, Deserialize)]
pub struct Environment {
    pub id: i64,
    pub name: String,
    pub slug: String,
    #[serde(default)]
    pub tier: Option<String>,
    #[serde(default)]
    pub last_deployment: Option<LastDeployment>,
    #[serde(default)]
    pub cluster_agent: Option<ClusterAgent>,
    #[serde(default)]
    pub kubernetes_namespace: Option<String>,
    #[serde(default)]
    pub flux_resource_path: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct LastDeployment {
    pub id: i64,
    #[serde(rename = "ref", default)]
    pub git_ref: Option<String>,
    #[serde(default)]
    pub deployable: Option<Deployable>,
}

/// The job of a deployment.
#[derive(Debug, Clone, Deserialize)]
pub struct Deployable {
    #[serde(default)]
    pub tag: Option<bool>,
}

/// `GET /projects/:id/repository/branches/:branch`.
#[derive(Debug, Clone, Deserialize)]
pub struct Branch {
    #[serde(default)]
    pub protected: bool,
}

/// `GET /projects/:id/repository/tags/:tag_name` (`doc/api/tags.md`): `protected` is GitLab's
/// own answer for the tag, its protected tags' wildcards (`v*`) matched by GitLab. Read rather
/// than `/projects/:id/protected_tags/:name`, which needs the Maintainer role and finds a
/// protection by its exact name only, so that a tag protected by `v*` would read unprotected.
#[derive(Debug, Clone, Deserialize)]
pub struct Tag {
    #[serde(default)]
    pub protected: bool,
}

/// The agent and namespace an environment names, taken for a deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentAgent {
    /// `<config project full path>:<agent name>`, as a job would name it.
    pub reference: String,
    pub agent_id: i64,
    pub config_project_id: i64,
    pub config_project_path: String,
    pub agent_name: String,
    /// `None`: the authorizing entry's `default_namespace`, then `default` (as SPEC 4.3).
    pub namespace: Option<String>,
    pub flux_resource_path: Option<String>,
    /// Whether the deployment was of a tag (then GitLab's protected tags decide, not branches).
    pub tag: bool,
}

/// Why an environment's agent is not taken for a deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotTaken {
    /// Another deployment is the environment's last: GitLab's fields are the last writer's,
    /// which may be that one's.
    NotLast { last: Option<i64> },
    /// GitLab names no agent for the environment (before 17.5, or a job without
    /// `environment:kubernetes:agent`).
    NoAgent,
}

impl NotTaken {
    pub fn reason(&self, deployment_id: i64) -> String {
        match self {
            NotTaken::NotLast { last: Some(last) } => format!(
                "the environment's last deployment is {last}, not {deployment_id}: its agent and \
                 namespace may be another deployment's, so none is recorded"
            ),
            NotTaken::NotLast { last: None } => format!(
                "the environment has no last deployment in GitLab's answer, so deployment \
                 {deployment_id}'s agent cannot be told"
            ),
            NotTaken::NoAgent => "GitLab names no agent for the environment (GitLab 17.5 or \
                 later writes it when the deploy job names `environment:kubernetes:agent`)"
                .to_owned(),
        }
    }

    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            NotTaken::NotLast { .. } => "not_last_deployment",
            NotTaken::NoAgent => "no_agent",
        }
    }
}

/// SPEC 12.2: an environment's `cluster_agent` and `kubernetes_namespace` are last-writer-wins,
/// so they are deployment `deployment_id`'s only when the environment's last deployment is it.
pub fn environment_agent(
    env: &Environment,
    deployment_id: i64,
) -> Result<EnvironmentAgent, NotTaken> {
    let last = env.last_deployment.as_ref();
    if last.map(|d| d.id) != Some(deployment_id) {
        return Err(NotTaken::NotLast {
            last: last.map(|d| d.id),
        });
    }
    let mut taken = named_agent(env).ok_or(NotTaken::NoAgent)?;
    taken.tag = last
        .and_then(|d| d.deployable.as_ref())
        .and_then(|j| j.tag)
        .unwrap_or(false);
    Ok(taken)
}

/// The agent, namespace and Flux resource path an environment names (`cluster_agent`, GitLab
/// 17.5+), whoever set them: SPEC 15's agent of an environment without a deployment job, which
/// `ci_access` must allow for the environment's project as for a deployment.
pub fn named_agent(env: &Environment) -> Option<EnvironmentAgent> {
    let agent = env.cluster_agent.as_ref()?;
    let non_empty = |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(str::to_owned);
    Some(EnvironmentAgent {
        reference: format!(
            "{}:{}",
            agent.config_project.path_with_namespace, agent.name
        ),
        agent_id: agent.id,
        config_project_id: agent.config_project.id,
        config_project_path: agent.config_project.path_with_namespace.clone(),
        agent_name: agent.name.clone(),
        namespace: non_empty(&env.kubernetes_namespace),
        flux_resource_path: non_empty(&env.flux_resource_path),
        tag: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An environment in the shape of GitLab's documented answer, our own values.
    fn environment(last: Option<i64>, agent: bool) -> Environment {
        let mut env = json!({
            "id": 5, "name": "review/fix-login", "slug": "review-fix-lo-x1y2z3",
            "external_url": null, "state": "available", "tier": "development",
            "created_at": "2026-11-20T10:00:00.000Z", "updated_at": "2026-11-20T10:05:00.000Z",
            "kubernetes_namespace": "review", "flux_resource_path": null,
            "auto_stop_setting": "always",
        });
        if let Some(id) = last {
            env["last_deployment"] = json!({"id": id, "iid": 3, "ref": "fix-login", "sha": "a1b2",
                "status": "success", "deployable": {"id": 777, "status": "success", "tag": false}});
        }
        if agent {
            env["cluster_agent"] = json!({"id": 7, "name": "prod",
                "config_project": {"id": 10, "name": "agents", "path_with_namespace": "acme/agents"},
                "created_at": "2026-01-01T00:00:00.000Z", "created_by_user_id": 1});
        }
        serde_json::from_value(env).unwrap()
    }

    #[test]
    fn the_last_deployments_agent_is_taken() {
        let taken = environment_agent(&environment(Some(42), true), 42).unwrap();
        assert_eq!(taken.reference, "acme/agents:prod");
        assert_eq!((taken.agent_id, taken.config_project_id), (7, 10));
        assert_eq!(taken.namespace.as_deref(), Some("review"));
        assert_eq!(taken.flux_resource_path, None);
        assert!(!taken.tag);
    }

    #[test]
    fn another_deployments_agent_is_not() {
        assert_eq!(
            environment_agent(&environment(Some(43), true), 42),
            Err(NotTaken::NotLast { last: Some(43) })
        );
        assert_eq!(
            environment_agent(&environment(None, true), 42),
            Err(NotTaken::NotLast { last: None })
        );
        let no_agent = environment_agent(&environment(Some(42), false), 42).unwrap_err();
        assert_eq!(no_agent, NotTaken::NoAgent);
        // Without a deployment, the environment's own agent.
        let named = named_agent(&environment(None, true)).unwrap();
        assert_eq!(
            (named.agent_id, named.reference.as_str()),
            (7, "acme/agents:prod")
        );
        assert!(named_agent(&environment(Some(42), false)).is_none());
        assert!(NotTaken::NotLast { last: Some(43) }
            .reason(42)
            .contains("last deployment is 43, not 42"));
    }
}
