//! Who may use which agent: pure decisions over rows already loaded, tested without I/O.

use crate::gitlab::agent_config::CiAccessEntry;

/// What a deployment job brings to the `ci_access` decision.
#[derive(Debug, Clone)]
pub struct Job<'a> {
    pub project_path: &'a str,
    pub environment: &'a str,
    pub git_ref: &'a str,
    pub protected_ref: bool,
}

/// The agent's `ci_access` entries that could apply to a project: `E` is the entry as the
/// caller holds it (parsed for a job's check, its stored JSON for GraphQL's
/// `ciAccessAuthorizedAgents`).
#[derive(Debug, Clone)]
pub struct CiAuthorizations<E = CiAccessEntry> {
    /// The agent's own configuration project is the project.
    pub is_config_project: bool,
    /// An entry naming the project.
    pub project: Option<E>,
    /// Entries naming an ancestor group of the project, with the group's depth (1 for a
    /// top-level group).
    pub groups: Vec<(usize, E)>,
}

impl<E> Default for CiAuthorizations<E> {
    fn default() -> Self {
        CiAuthorizations {
            is_config_project: false,
            project: None,
            groups: Vec::new(),
        }
    }
}

/// The authorization that wins for a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CiMatch<'a, E> {
    /// The agent's configuration project: always authorized, unrestricted.
    ConfigProject,
    /// A `ci_access` entry, for the project or its nearest listed ancestor group.
    Entry(&'a E),
}

/// GitLab's `ci_access` rule for a project: the first authorization wins, in the order
/// explicit project entry, the agent's configuration project, the nearest ancestor group.
/// `None` when nothing authorizes the project. Deployment creation (SPEC 4.3) then applies
/// the winning entry's restrictions to the job ([`ci_access`]); GraphQL's
/// `ciAccessAuthorizedAgents` lists the agent with that entry.
pub fn ci_authorization<E>(auth: &CiAuthorizations<E>) -> Option<CiMatch<'_, E>> {
    if let Some(entry) = &auth.project {
        Some(CiMatch::Entry(entry))
    } else if auth.is_config_project {
        Some(CiMatch::ConfigProject)
    } else {
        let nearest = auth.groups.iter().max_by_key(|(depth, _)| *depth);
        nearest.map(|(_, entry)| CiMatch::Entry(entry))
    }
}

/// Why the job may not use the agent, in words for the person reading the CI job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    NotAuthorized,
    EnvironmentNotAllowed { patterns: Vec<String> },
    UnprotectedRef,
}

impl Refusal {
    pub fn reason(&self, job: &Job, agent: &str) -> String {
        match self {
            Refusal::NotAuthorized => format!(
                "project {} is not authorized to use agent {agent}: add the project or one of its \
                 groups to ci_access in the agent's configuration file",
                job.project_path
            ),
            Refusal::EnvironmentNotAllowed { patterns } => format!(
                "agent {agent} does not allow environment \"{}\" for project {}: its ci_access \
                 entry allows only {}",
                job.environment,
                job.project_path,
                patterns.join(", ")
            ),
            Refusal::UnprotectedRef => format!(
                "agent {agent} may be used by project {} only from protected branches and tags \
                 (protected_branches_only), and \"{}\" is not protected",
                job.project_path, job.git_ref
            ),
        }
    }
}

/// GitLab's `ci_access` rule for a deployment job: the authorization that wins for its project
/// ([`ci_authorization`]), then that entry's `environments` and `protected_branches_only`.
/// Returns the winning entry (`None` for the configuration project).
pub fn ci_access<'a>(
    job: &Job,
    auth: &'a CiAuthorizations,
) -> Result<Option<&'a CiAccessEntry>, Refusal> {
    let entry = match ci_authorization(auth) {
        None => return Err(Refusal::NotAuthorized),
        Some(CiMatch::ConfigProject) => return Ok(None),
        Some(CiMatch::Entry(entry)) => entry,
    };
    if let Some(patterns) = entry.environments.as_ref().filter(|p| !p.is_empty()) {
        if !patterns
            .iter()
            .any(|p| environment_matches(p, job.environment))
        {
            return Err(Refusal::EnvironmentNotAllowed {
                patterns: patterns.clone(),
            });
        }
    }
    if entry.protected_branches_only && !job.protected_ref {
        return Err(Refusal::UnprotectedRef);
    }
    Ok(Some(entry))
}

/// An environment name against a pattern where `*` stands for any run of characters (`/`
/// included, so `review/*` matches `review/feature/x`); everything else matches itself.
pub fn environment_matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if name.len() < first.len() + last.len() || !name.starts_with(first) || !name.ends_with(last) {
        return false;
    }
    // Greedy left to right over the middle, within what the prefix and suffix leave.
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// GitLab's roles with their access levels, lowest first (5, minimal access, is no role).
pub const ROLES: [(i32, &str); 6] = [
    (10, "guest"),
    (15, "planner"),
    (20, "reporter"),
    (30, "developer"),
    (40, "maintainer"),
    (50, "owner"),
];
const DEVELOPER: i32 = 30;
const MAINTAINER: i32 = 40;
const OWNER: i32 = 50;

/// Whether the user maintains a project, as GitLab's project policy decides: Maintainer (40) or
/// Owner through the project or an ancestor group (`level`, their highest), or an admin.
pub fn maintains_project(admin: bool, level: Option<i32>) -> bool {
    admin || level.is_some_and(|level| level >= MAINTAINER)
}

/// One `user_access` entry of an agent, with the user's access to what it names: their
/// effective access for a project, their own or an ancestor group's membership for a group.
#[derive(Debug, Clone, PartialEq)]
pub struct UserAccessEntry {
    pub kind: SourceKind,
    pub id: i64,
    /// `None` when the user has no access there at all.
    pub access_level: Option<i32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Project,
    Group,
}

/// How requests reach the cluster: with the agent's own identity, or impersonating the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessAs {
    Agent,
    User,
}

impl AccessAs {
    /// The section's `access_as` as stored (`{agent: {}}` or `{user: {}}`); anything else is none.
    pub fn from_config(value: Option<&serde_json::Value>) -> Option<Self> {
        let object = value?.as_object()?;
        match (object.contains_key("agent"), object.contains_key("user")) {
            (true, false) => Some(AccessAs::Agent),
            (false, true) => Some(AccessAs::User),
            _ => None,
        }
    }
}

/// A granted `user_access`: how to reach the cluster, and the entries the user qualifies
/// through with their roles (every role at or below the user's, lowest first).
#[derive(Debug, Clone, PartialEq)]
pub struct UserAuthorization {
    pub access_as: AccessAs,
    pub projects: Vec<(i64, Vec<&'static str>)>,
    pub groups: Vec<(i64, Vec<&'static str>)>,
}

/// GitLab's `user_access` rule: the user qualifies through an entry where their access is
/// developer or higher (an admin counts as owner everywhere), and the section must say
/// `access_as`. `None` is a refusal; callers must not say which part failed.
pub fn user_access(
    admin: bool,
    access_as: Option<AccessAs>,
    entries: &[UserAccessEntry],
) -> Option<UserAuthorization> {
    let access_as = access_as?;
    let mut granted = UserAuthorization {
        access_as,
        projects: Vec::new(),
        groups: Vec::new(),
    };
    for entry in entries {
        let level = if admin {
            OWNER
        } else {
            entry.access_level.unwrap_or(0)
        };
        if level < DEVELOPER {
            continue;
        }
        let roles = ROLES
            .iter()
            .filter(|(l, _)| *l <= level)
            .map(|(_, r)| *r)
            .collect();
        match entry.kind {
            SourceKind::Project => granted.projects.push((entry.id, roles)),
            SourceKind::Group => granted.groups.push((entry.id, roles)),
        }
    }
    (!granted.projects.is_empty() || !granted.groups.is_empty()).then_some(granted)
}

/// GitLab's `user_access` rule for one project, as GraphQL's `userAccessAuthorizedAgents` asks
/// it: [`user_access`] itself, over the agent's entries that cover the project (its own entry,
/// then those of its ancestor groups, nearest first). Returns the position in `entries` of the
/// first entry the user qualifies through, whose configuration is shown; `None` is a refusal.
pub fn user_access_for_project(
    admin: bool,
    access_as: Option<AccessAs>,
    entries: &[UserAccessEntry],
) -> Option<usize> {
    let granted = user_access(admin, access_as, entries)?;
    entries.iter().position(|entry| {
        let through = match entry.kind {
            SourceKind::Project => &granted.projects,
            SourceKind::Group => &granted.groups,
        };
        through.iter().any(|(id, _)| *id == entry.id)
    })
}

/// What GitLab's `read_cluster_agent` (its `Clusters::AgentPolicy`) looks at, for one agent
/// and one user.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentReaders {
    /// The user's access to the agent's configuration project.
    pub project_level: Option<i32>,
    /// The user's best access to a project the agent's `ci_access` authorizes.
    pub ci_access_level: Option<i32>,
    /// The agent's `user_access` section: its `access_as` and its entries.
    pub access_as: Option<AccessAs>,
    pub user_access: Vec<UserAccessEntry>,
}

/// Whether the user may read the agent, its configuration and its tokens: an admin; a
/// Developer of its project (GitLab's project policy); a Developer of a project its `ci_access`
/// authorizes; or someone its `user_access` admits ([`user_access`]). A Reporter, or a reader
/// of a public or internal project, may not: to them the agent is as if it did not exist.
pub fn read_cluster_agent(admin: bool, agent: &AgentReaders) -> bool {
    let developer = |level: Option<i32>| level.unwrap_or(0) >= DEVELOPER;
    admin
        || developer(agent.project_level)
        || developer(agent.ci_access_level)
        || user_access(admin, agent.access_as, &agent.user_access).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maintainers_owners_and_admins_maintain_a_project() {
        assert!(maintains_project(false, Some(40)));
        assert!(maintains_project(false, Some(50)));
        assert!(maintains_project(true, None));
        assert!(!maintains_project(false, Some(30)));
        assert!(!maintains_project(false, None));
    }

    #[test]
    fn reading_an_agent_needs_developer_somewhere_it_serves() {
        let nobody = AgentReaders::default();
        assert!(!read_cluster_agent(false, &nobody));
        assert!(read_cluster_agent(true, &nobody));
        let reporter = AgentReaders {
            project_level: Some(20),
            ci_access_level: Some(20),
            ..nobody.clone()
        };
        assert!(!read_cluster_agent(false, &reporter));
        let project_developer = AgentReaders {
            project_level: Some(30),
            ..nobody.clone()
        };
        assert!(read_cluster_agent(false, &project_developer));
        let deployer = AgentReaders {
            ci_access_level: Some(40),
            ..nobody.clone()
        };
        assert!(read_cluster_agent(false, &deployer));
        let admitted = AgentReaders {
            access_as: Some(AccessAs::Agent),
            user_access: vec![UserAccessEntry {
                kind: SourceKind::Group,
                id: 1,
                access_level: Some(30),
            }],
            ..nobody.clone()
        };
        assert!(read_cluster_agent(false, &admitted));
        // The same entry without `access_as` admits nobody.
        let unset = AgentReaders {
            access_as: None,
            ..admitted
        };
        assert!(!read_cluster_agent(false, &unset));
    }

    fn entry(environments: Option<&[&str]>, protected_only: bool) -> CiAccessEntry {
        CiAccessEntry {
            id: "x".into(),
            default_namespace: None,
            environments: environments.map(|e| e.iter().map(|s| s.to_string()).collect()),
            protected_branches_only: protected_only,
            access_as: None,
        }
    }

    fn job(environment: &str, protected_ref: bool) -> Job<'_> {
        Job {
            project_path: "group/app",
            environment,
            git_ref: "feature",
            protected_ref,
        }
    }

    #[test]
    fn patterns() {
        let cases = [
            ("production", "production", true),
            ("production", "Production", false),
            ("production", "production-eu", false),
            ("review/*", "review/feature/x", true),
            ("review/*", "review/", true),
            ("review/*", "review", false),
            ("*", "anything", true),
            ("*-eu", "prod-eu", true),
            ("*-eu", "prod-us", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxcyyb", false),
            ("a*a", "a", false),
        ];
        for (pattern, name, expected) in cases {
            assert_eq!(
                environment_matches(pattern, name),
                expected,
                "{pattern} ~ {name}"
            );
        }
    }

    #[test]
    fn first_authorization_wins_in_gitlab_order() {
        let production_only = entry(Some(&["production"]), false);
        let anything = entry(None, false);
        // An explicit project entry beats the configuration project and groups, even when
        // it refuses.
        let auth = CiAuthorizations {
            is_config_project: true,
            project: Some(production_only.clone()),
            groups: vec![(1, anything.clone())],
        };
        assert!(matches!(
            ci_access(&job("staging", true), &auth),
            Err(Refusal::EnvironmentNotAllowed { .. })
        ));
        // The configuration project beats groups.
        let auth = CiAuthorizations {
            is_config_project: true,
            groups: vec![(1, production_only.clone())],
            ..Default::default()
        };
        assert_eq!(ci_access(&job("staging", false), &auth), Ok(None));
        // The nearest ancestor group beats the others, whatever their order.
        let auth = CiAuthorizations {
            groups: vec![
                (1, anything.clone()),
                (3, production_only.clone()),
                (2, anything),
            ],
            ..Default::default()
        };
        assert!(ci_access(&job("staging", true), &auth).is_err());
        assert_eq!(
            ci_access(&job("production", true), &auth),
            Ok(Some(&production_only))
        );
        assert_eq!(
            ci_access(&job("x", true), &CiAuthorizations::default()),
            Err(Refusal::NotAuthorized)
        );
    }

    #[test]
    fn restrictions_of_the_winning_entry() {
        let auth = |e| CiAuthorizations {
            project: Some(e),
            ..Default::default()
        };
        assert_eq!(
            ci_access(&job("production", false), &auth(entry(None, true))),
            Err(Refusal::UnprotectedRef)
        );
        assert!(ci_access(&job("production", true), &auth(entry(None, true))).is_ok());
        assert!(ci_access(
            &job("review/x", true),
            &auth(entry(Some(&["review/*"]), false))
        )
        .is_ok());
        // An empty list restricts nothing.
        assert!(ci_access(&job("anything", true), &auth(entry(Some(&[]), false))).is_ok());
        let restricted = auth(entry(Some(&["production", "review/*"]), true));
        let refusal = ci_access(&job("staging", false), &restricted).unwrap_err();
        assert_eq!(
            refusal.reason(&job("staging", false), "group/agents:prod"),
            "agent group/agents:prod does not allow environment \"staging\" for project group/app: \
             its ci_access entry allows only production, review/*"
        );
    }

    fn grant(kind: SourceKind, id: i64, level: Option<i32>) -> UserAccessEntry {
        UserAccessEntry {
            kind,
            id,
            access_level: level,
        }
    }

    #[test]
    fn user_access_needs_developer_through_an_entry() {
        use SourceKind::{Group, Project};
        let user = Some(AccessAs::User);
        let granted = user_access(
            false,
            user,
            &[
                grant(Project, 1, Some(30)),
                grant(Project, 2, Some(20)),
                grant(Group, 3, Some(40)),
                grant(Group, 4, None),
            ],
        )
        .unwrap();
        assert_eq!(
            granted.projects,
            [(1, vec!["guest", "planner", "reporter", "developer"])]
        );
        assert_eq!(
            granted.groups,
            [(
                3,
                vec!["guest", "planner", "reporter", "developer", "maintainer"]
            )]
        );
        // Reporter and no access anywhere: refused.
        assert_eq!(
            user_access(
                false,
                user,
                &[grant(Project, 2, Some(20)), grant(Group, 4, None)]
            ),
            None
        );
        assert_eq!(user_access(false, user, &[]), None);
    }

    #[test]
    fn admins_are_owners_and_access_as_is_required() {
        let entries = [grant(SourceKind::Project, 1, None)];
        let granted = user_access(true, Some(AccessAs::Agent), &entries).unwrap();
        assert_eq!(granted.access_as, AccessAs::Agent);
        assert_eq!(granted.projects[0].1.last(), Some(&"owner"));
        assert_eq!(granted.projects[0].1.len(), ROLES.len());
        assert_eq!(user_access(true, None, &entries), None);
        let owner = [grant(SourceKind::Group, 1, Some(50))];
        assert_eq!(user_access(false, None, &owner), None);
    }

    #[test]
    fn access_as_shapes() {
        use serde_json::json;
        assert_eq!(
            AccessAs::from_config(Some(&json!({"user": {}}))),
            Some(AccessAs::User)
        );
        assert_eq!(
            AccessAs::from_config(Some(&json!({"agent": {}}))),
            Some(AccessAs::Agent)
        );
        assert_eq!(AccessAs::from_config(Some(&json!(null))), None);
        assert_eq!(AccessAs::from_config(Some(&json!({}))), None);
        assert_eq!(AccessAs::from_config(None), None);
    }

    #[test]
    fn user_access_for_a_project_shows_the_entry_that_admits() {
        use SourceKind::{Group, Project};
        let user = Some(AccessAs::User);
        // The project's own entry admits: it is the one shown.
        let entries = [grant(Project, 11, Some(30)), grant(Group, 2, Some(40))];
        assert_eq!(user_access_for_project(false, user, &entries), Some(0));
        // A reporter of the project, developer through its nearest group.
        let entries = [
            grant(Project, 11, Some(20)),
            grant(Group, 2, Some(30)),
            grant(Group, 1, Some(30)),
        ];
        assert_eq!(user_access_for_project(false, user, &entries), Some(1));
        // No entry admits; no access_as; no entry at all.
        let reporter = [grant(Project, 11, Some(20)), grant(Group, 1, None)];
        assert_eq!(user_access_for_project(false, user, &reporter), None);
        assert_eq!(user_access_for_project(true, None, &reporter), None);
        assert_eq!(user_access_for_project(true, user, &[]), None);
        // An admin is admitted through the first entry.
        assert_eq!(user_access_for_project(true, user, &reporter), Some(0));
    }

    #[test]
    fn the_winning_ci_authorization_of_a_project() {
        let auth = CiAuthorizations {
            is_config_project: true,
            project: None,
            groups: vec![(1, "top"), (2, "sub")],
        };
        assert_eq!(ci_authorization(&auth), Some(CiMatch::ConfigProject));
        let auth = CiAuthorizations {
            is_config_project: false,
            ..auth
        };
        assert_eq!(ci_authorization(&auth), Some(CiMatch::Entry(&"sub")));
        let auth = CiAuthorizations {
            project: Some("own"),
            ..auth
        };
        assert_eq!(ci_authorization(&auth), Some(CiMatch::Entry(&"own")));
        assert_eq!(ci_authorization(&CiAuthorizations::<&str>::default()), None);
    }
}
