//! The parts of an agent's `.gitlab/agents/<name>/config.yaml` that envlens acts on:
//! `ci_access` and `user_access`. Every other key is kept as it came, unread.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// GitLab's limit of entries per list.
pub const MAX_ENTRIES: usize = 500;

#[derive(Debug, Default, Deserialize)]
pub struct AgentConfig {
    #[serde(default)]
    pub ci_access: Option<CiAccess>,
    #[serde(default)]
    pub user_access: Option<UserAccess>,
}

#[derive(Debug, Default, Deserialize)]
pub struct CiAccess {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub projects: Vec<CiAccessEntry>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub groups: Vec<CiAccessEntry>,
}

/// One project or group that may use the agent from CI, with its restrictions.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct CiAccessEntry {
    /// Full path, matched case-insensitively.
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_namespace: Option<String>,
    /// Environment name patterns (`*` wildcard); `None` allows every environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environments: Option<Vec<String>>,
    #[serde(default)]
    pub protected_branches_only: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_as: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct UserAccess {
    /// `{agent: {}}` or `{user: {}}`; required for the access to be usable.
    #[serde(default)]
    pub access_as: Option<Value>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub projects: Vec<UserAccessEntry>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub groups: Vec<UserAccessEntry>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct UserAccessEntry {
    pub id: String,
}

/// YAML's `projects:` with nothing after it arrives as `null`.
fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

impl AgentConfig {
    /// Checks the limits and shapes GitLab enforces; `prefix` is the field path of the config.
    pub fn validate(&self, prefix: &str) -> Result<()> {
        if let Some(ci) = &self.ci_access {
            for (list, entries) in [("projects", &ci.projects), ("groups", &ci.groups)] {
                let field = format!("{prefix}.ci_access.{list}");
                check_len(&field, entries.len())?;
                for (i, e) in entries.iter().enumerate() {
                    check_id(&format!("{field}[{i}].id"), &e.id)?;
                    for (j, pattern) in e.environments.iter().flatten().enumerate() {
                        if pattern.trim().is_empty() {
                            return Err(Error::invalid(
                                format!("{field}[{i}].environments[{j}]"),
                                "must not be empty",
                            ));
                        }
                    }
                }
            }
        }
        if let Some(user) = &self.user_access {
            if let Some(access_as) = &user.access_as {
                let valid = access_as.as_object().is_some_and(|o| {
                    o.len() == 1 && (o.contains_key("agent") || o.contains_key("user"))
                });
                if !valid {
                    return Err(Error::invalid(
                        format!("{prefix}.user_access.access_as"),
                        "must be `{agent: {}}` or `{user: {}}`",
                    ));
                }
            }
            for (list, entries) in [("projects", &user.projects), ("groups", &user.groups)] {
                let field = format!("{prefix}.user_access.{list}");
                check_len(&field, entries.len())?;
                for (i, e) in entries.iter().enumerate() {
                    check_id(&format!("{field}[{i}].id"), &e.id)?;
                }
            }
        }
        Ok(())
    }
}

fn check_len(field: &str, len: usize) -> Result<()> {
    if len > MAX_ENTRIES {
        return Err(Error::invalid(
            field,
            format!("has {len} entries; at most {MAX_ENTRIES} are allowed"),
        ));
    }
    Ok(())
}

fn check_id(field: &str, id: &str) -> Result<()> {
    crate::gitlab::validate::full_path(field, id.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(v: Value) -> Result<AgentConfig> {
        let c: AgentConfig = crate::http::extract::from_value(v, "agent_config")?;
        c.validate("agent_config")?;
        Ok(c)
    }

    fn field(r: Result<AgentConfig>) -> String {
        match r {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn reads_the_documented_shape() {
        let c = config(json!({
            "ci_access": {
                "projects": [{"id": "group/app", "default_namespace": "apps", "environments": ["review/*", "production"], "protected_branches_only": true, "access_as": {"agent": {}}}],
                "groups": [{"id": "group/sub"}]
            },
            "user_access": {"access_as": {"user": {}}, "projects": null, "groups": [{"id": "group"}]},
            "gitops": {"manifest_projects": []}
        }))
        .unwrap();
        let ci = c.ci_access.unwrap();
        assert_eq!(
            ci.projects[0].environments.as_deref(),
            Some(&["review/*".to_owned(), "production".to_owned()][..])
        );
        assert!(ci.projects[0].protected_branches_only);
        assert_eq!(ci.groups[0].environments, None);
        let user = c.user_access.unwrap();
        assert!(user.projects.is_empty());
        assert_eq!(user.groups[0].id, "group");
    }

    #[test]
    fn names_the_bad_field() {
        assert_eq!(
            field(config(
                json!({"ci_access": {"projects": [{"default_namespace": "x"}]}})
            )),
            "agent_config.ci_access.projects[0].id"
        );
        assert_eq!(
            field(config(json!({"ci_access": {"groups": [{"id": "a//b"}]}}))),
            "agent_config.ci_access.groups[0].id"
        );
        assert_eq!(
            field(config(
                json!({"ci_access": {"projects": [{"id": "a", "environments": "prod"}]}})
            )),
            "agent_config.ci_access.projects[0].environments"
        );
        assert_eq!(
            field(config(json!({"user_access": {"access_as": {"root": {}}}}))),
            "agent_config.user_access.access_as"
        );
        let many: Vec<Value> = (0..501).map(|i| json!({"id": format!("g/p{i}")})).collect();
        assert_eq!(
            field(config(json!({"user_access": {"projects": many}}))),
            "agent_config.user_access.projects"
        );
    }
}
