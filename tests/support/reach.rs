//! How a test's envlens reaches the test cluster (SPEC 6 and 14): through an entry of the
//! configuration (a kubeconfig context), or with no entry, through GitLab's agent server
//! ([`super::kas`]); and [`both_ways!`], which runs one test body both ways, since every feature
//! must work alike through either.

use serde_json::json;
use tempfile::TempDir;

use super::kas::{through_kas, ThroughKas, AGENT_SERVICE_ACCOUNT, ENVLENS_USER};
use super::kube_api::{KubeApi, Served};

/// How envlens reaches the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// A kubeconfig context per agent, authenticated with the kubeconfig's token.
    Kubeconfig,
    /// No entry: GitLab's agent server, with envlens' `k8s_proxy` token.
    Kas,
}

/// `both_ways!(name)` (or `both_ways!(#[tokio::test(...)] name)`): the tests
/// `name::kubeconfig` and `name::through_kas`, each running the body `async fn name(reach:
/// Reach)` of the enclosing module. (The benches include this support without the tests.)
#[allow(unused_macros)]
macro_rules! both_ways {
    ($name:ident) => {
        $crate::support::reach::both_ways!(
            #[tokio::test]
            $name
        );
    };
    (#[$test:meta] $name:ident) => {
        mod $name {
            #[$test]
            async fn kubeconfig() {
                super::$name($crate::support::reach::Reach::Kubeconfig).await
            }

            #[$test]
            async fn through_kas() {
                super::$name($crate::support::reach::Reach::Kas).await
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use both_ways;

/// envlens' configuration for reaching some agents of a test cluster one way, and what must
/// live as long as the test: GitLab and KAS in front of the cluster, the token's file.
pub struct Reached {
    pub reach: Reach,
    /// Lines of the `kubernetes` section: the kubeconfig's entries (none through KAS).
    pub entries: String,
    /// The top-level `gitlab` section that configures KAS (empty for a kubeconfig).
    pub gitlab: String,
    pub kas: Option<ThroughKas>,
    _dir: Option<TempDir>,
}

impl Reached {
    /// `agents` of `served` (their kubeconfig entry as `served.connections` names it, their id),
    /// whose configuration project is `config_project`. Through KAS their agentk is connected
    /// and envlens' token's user may use them, `access_as: agent` until
    /// [`Reached::access_as_user`] says otherwise.
    pub async fn new(
        reach: Reach,
        served: &Served,
        agents: &[(&str, i64)],
        config_project: i64,
    ) -> Reached {
        match reach {
            Reach::Kubeconfig => {
                let entries: Vec<&str> = agents.iter().map(|(entry, _)| *entry).collect();
                Reached {
                    reach,
                    entries: served.connections(&entries),
                    gitlab: String::new(),
                    kas: None,
                    _dir: None,
                }
            }
            Reach::Kas => {
                let dir = tempfile::tempdir().unwrap();
                let ids: Vec<(i64, i64)> =
                    agents.iter().map(|(_, id)| (*id, config_project)).collect();
                let kas = through_kas(served, &ids, dir.path()).await;
                Reached {
                    reach,
                    entries: String::new(),
                    gitlab: kas.yaml.clone(),
                    kas: Some(kas),
                    _dir: Some(dir),
                }
            }
        }
    }

    /// envlens' configuration file: the `kubernetes` section with the entries and `kubernetes`
    /// (more lines of that section; none, no section), then `rest` (top-level sections), then
    /// `gitlab`.
    pub fn config(&self, kubernetes: &str, rest: &str) -> String {
        let section = format!("{}{kubernetes}", self.entries);
        let section = match section.is_empty() {
            true => section,
            false => format!("kubernetes:\n{section}"),
        };
        format!("{section}{rest}{}", self.gitlab)
    }

    /// The agent's `user_access.access_as`, as KAS learns it from GitLab (the same
    /// configuration file envlens' mirror holds): `user` impersonates envlens' token's user.
    /// Nothing to do for a kubeconfig, whose identity is its own.
    pub fn access_as_user(&self, agent: i64, config_project: i64, as_user: bool) {
        if let Some(kas) = &self.kas {
            kas.gitlab.kas.allow(
                agent,
                config_project,
                as_user,
                ENVLENS_USER.0,
                config_project,
            );
        }
    }

    /// Through KAS, lets whom the cluster sees on envlens' own requests do anything once RBAC is
    /// enforced (the kubeconfig's token is an administrator already): the agent's ServiceAccount,
    /// bound to `cluster-admin` as the gitlab-agent chart binds it by default, and envlens'
    /// token's user under `access_as: user`, as its operator binds it. RBAC then judges the
    /// viewers alone, as through a kubeconfig.
    pub fn admit_own_identity(&self, api: &KubeApi) {
        if self.reach == Reach::Kubeconfig {
            return;
        }
        api.insert(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "cluster-admin"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
        );
        api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "gitlab-agent"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "gitlab-agent", "namespace": "gitlab-agent"},
                         {"kind": "User", "name": format!("gitlab:user:{}", ENVLENS_USER.1)}]}));
    }

    /// Whom the cluster's impersonation headers name on envlens' own requests (its lists and
    /// watches): none with the kubeconfig's token; through KAS, the agent's ServiceAccount, or
    /// envlens' token's user under `access_as: user`.
    pub fn own_identity(&self, as_user: bool) -> Option<String> {
        match (self.reach, as_user) {
            (Reach::Kubeconfig, _) => None,
            (Reach::Kas, false) => Some(AGENT_SERVICE_ACCOUNT.to_owned()),
            (Reach::Kas, true) => Some(format!("gitlab:user:{}", ENVLENS_USER.1)),
        }
    }
}
