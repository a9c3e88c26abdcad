//! A `Push Hook` (`doc/user/project/integrations/webhook_events.md`, push events) and whether
//! it may have changed an agent's configuration file, `.gitlab/agents/<name>/config.yaml` at
//! the project's default branch (SPEC 12.3). Pure.

use serde::Deserialize;

use super::hook_scope::Footprint;

/// The keys of a push event that envlens reads.
#[derive(Debug, Deserialize)]
pub struct PushEvent {
    pub project_id: i64,
    #[serde(rename = "ref")]
    pub git_ref: String,
    pub project: PushProject,
    #[serde(default)]
    pub commits: Vec<PushCommit>,
    /// The push's commits; `commits` holds the newest 20 only.
    #[serde(default)]
    pub total_commits_count: Option<usize>,
}

#[derive(Debug, Deserialize)]
pub struct PushProject {
    pub path_with_namespace: String,
    #[serde(default)]
    pub default_branch: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct PushCommit {
    #[serde(default)]
    pub added: Vec<String>,
    #[serde(default)]
    pub modified: Vec<String>,
    #[serde(default)]
    pub removed: Vec<String>,
}

const AGENTS_FOLDER: &str = ".gitlab/agents/";

impl PushEvent {
    /// What the push touches, for the rule of a group's webhook token: its project, whose
    /// agents are read again, which must be in the mirror.
    pub fn footprint(&self) -> Footprint {
        Footprint {
            paths: vec![(
                "project.path_with_namespace",
                self.project.path_with_namespace.clone(),
            )],
            projects: vec![(self.project_id, true)],
            ..Footprint::default()
        }
    }

    /// `None` when the agents' configuration may have changed; else why not, in words.
    pub fn agents_untouched(&self) -> Option<String> {
        let default = self.project.default_branch.as_deref().unwrap_or_default();
        if self.git_ref.strip_prefix("refs/heads/") != Some(default) || default.is_empty() {
            return Some(format!(
                "a push to {}, not to the default branch, whose `{AGENTS_FOLDER}` envlens reads",
                self.git_ref
            ));
        }
        // GitLab lists only the newest 20 commits: with more, any of the others may have.
        if self.total_commits_count.unwrap_or(0) > self.commits.len() {
            return None;
        }
        let touched = self.commits.iter().any(|c| {
            c.added
                .iter()
                .chain(&c.modified)
                .chain(&c.removed)
                .any(|path| path.starts_with(AGENTS_FOLDER))
        });
        (!touched).then(|| format!("the push touches nothing under `{AGENTS_FOLDER}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn push(git_ref: &str, files: &[&str], total: usize) -> PushEvent {
        serde_json::from_value(json!({
            "object_kind": "push", "event_name": "push", "before": "0a", "after": "1b",
            "ref": git_ref, "ref_protected": true, "checkout_sha": "1b", "user_id": 2,
            "project_id": 10,
            "project": {"id": 10, "name": "agents", "path_with_namespace": "acme/agents",
                        "default_branch": "main", "visibility_level": 0},
            "commits": [{"id": "1b", "message": "m", "added": [], "modified": files, "removed": []}],
            "total_commits_count": total,
        }))
        .unwrap()
    }

    #[test]
    fn a_change_under_the_agents_folder_on_the_default_branch_counts() {
        assert_eq!(
            push("refs/heads/main", &[".gitlab/agents/prod/config.yaml"], 1).agents_untouched(),
            None
        );
        assert!(push("refs/heads/main", &["README.md"], 1)
            .agents_untouched()
            .is_some());
        assert!(
            push("refs/heads/topic", &[".gitlab/agents/prod/config.yaml"], 1)
                .agents_untouched()
                .is_some()
        );
        // More commits than listed: any may have touched it.
        assert_eq!(
            push("refs/heads/main", &["README.md"], 25).agents_untouched(),
            None
        );
        assert!(push("refs/tags/v1", &[], 0).agents_untouched().is_some());
    }
}
