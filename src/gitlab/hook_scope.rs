//! Whom a webhook event may change (SPEC 13, "Webhook tokens per source"). Pure.
//!
//! The instance's webhook token is GitLab's administrators': an event under it may change
//! anything. A group's token is given to that group's Owners, who configure the group's
//! webhook with it; whoever holds it can also send any payload they like. So an event under a
//! group's token may change only that group, its subgroups and their projects, and the rule
//! is read from both sides: every path the payload names, and the path the mirror has for
//! every object the payload names by id (a payload that gives group A's project id with a path
//! under B would otherwise move A's project). A rename or a transfer therefore needs both its
//! old and its new path inside the subtree. User accounts are the instance's: such an event
//! never creates, renames or deletes a user, and a membership of a user the mirror lacks is
//! not applied.

use std::collections::HashMap;

/// What an event touches, as its payload gives it: the caller fills it from the event, loads
/// the mirror's rows for the ids ([`Located`]), and asks [`decide`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Footprint {
    /// Paths the payload names: where it writes, and where a rename or a transfer comes from.
    pub paths: Vec<(&'static str, String)>,
    /// Projects and groups by id; `true` when the event acts on the object itself (a
    /// membership, a removal, a push), which then must be in the mirror.
    pub projects: Vec<(i64, bool)>,
    pub groups: Vec<(i64, bool)>,
    /// Users whose membership the event writes: they must be in the mirror.
    pub users: Vec<i64>,
    /// Deployments and deploy jobs by id, whose projects must be in the subtree too.
    pub deployments: Vec<i64>,
    pub jobs: Vec<i64>,
    /// Set when the event reaches beyond any group (user accounts, system hooks): in words.
    pub instance_wide: Option<&'static str>,
}

/// The mirror's rows for a footprint's ids: each object's full path (a deployment's and a
/// job's: its project's, empty when the mirror lacks that project), and the users it has.
#[derive(Debug, Default, Clone)]
pub struct Located {
    pub rows: HashMap<(Kind, i64), Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Project,
    Group,
    User,
    Deployment,
    Job,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "project" => Kind::Project,
            "group" => Kind::Group,
            "user" => Kind::User,
            "deployment" => Kind::Deployment,
            "job" => Kind::Job,
            _ => return None,
        })
    }

    fn noun(self) -> &'static str {
        match self {
            Kind::Project => "project",
            Kind::Group => "group",
            Kind::User => "user",
            Kind::Deployment => "deployment",
            Kind::Job => "deploy job",
        }
    }
}

/// What becomes of an event under a group's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Everything it touches is inside the group's subtree.
    Allowed,
    /// It reaches outside (403, nothing changes); the reason names what.
    Forbidden(String),
    /// Inside as far as the mirror knows, but it acts on something the mirror lacks (an
    /// unknown user, say): acknowledged and not applied.
    Unapplied(String),
}

/// Whether `path` is the group `scope` or below it; GitLab's paths are matched
/// case-insensitively.
pub fn in_subtree(path: &str, scope: &str) -> bool {
    let (path, scope) = (path.to_lowercase(), scope.to_lowercase());
    path == scope
        || path
            .strip_prefix(&scope)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The rule for an event under the token of group `scope` (its full path).
pub fn decide(scope: &str, footprint: &Footprint, located: &Located) -> Verdict {
    let outside = |what: String| {
        Verdict::Forbidden(format!(
            "{what}, outside group {scope}, whose webhook token this is"
        ))
    };
    if let Some(what) = footprint.instance_wide {
        return Verdict::Forbidden(format!(
            "{what}: only the instance's webhook token may send it, not group {scope}'s"
        ));
    }
    for (field, path) in &footprint.paths {
        if !in_subtree(path, scope) {
            return outside(format!("`{field}` {path} is"));
        }
    }
    let named = footprint
        .projects
        .iter()
        .map(|&(id, needed)| (Kind::Project, id, needed))
        .chain(footprint.groups.iter().map(|&(id, n)| (Kind::Group, id, n)))
        .chain(
            footprint
                .deployments
                .iter()
                .map(|&id| (Kind::Deployment, id, false)),
        )
        .chain(footprint.jobs.iter().map(|&id| (Kind::Job, id, false)));
    let mut missing = None;
    for (kind, id, needed) in named {
        match located.rows.get(&(kind, id)) {
            Some(paths) => {
                if let Some(path) = paths.iter().find(|p| !in_subtree(p, scope)) {
                    let at = if path.is_empty() {
                        "of a project the mirror does not know".to_owned()
                    } else {
                        format!("at {path}")
                    };
                    return outside(format!("{} {id} is {at}", kind.noun()));
                }
            }
            None if needed => {
                missing.get_or_insert(format!("{} {id} is not in the mirror", kind.noun()));
            }
            None => {}
        }
    }
    let unknown_user = footprint
        .users
        .iter()
        .find(|id| !located.rows.contains_key(&(Kind::User, **id)));
    if let Some(id) = unknown_user {
        missing.get_or_insert(format!(
            "user {id} is not in the mirror, and a group's webhook never creates a user"
        ));
    }
    match missing {
        Some(reason) => Verdict::Unapplied(reason),
        None => Verdict::Allowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn located(rows: &[(Kind, i64, &str)]) -> Located {
        let mut located = Located::default();
        for (kind, id, path) in rows {
            located
                .rows
                .entry((*kind, *id))
                .or_default()
                .push(path.to_string());
        }
        located
    }

    #[test]
    fn the_subtree_is_the_group_and_what_is_below_it() {
        assert!(in_subtree("b", "b"));
        assert!(in_subtree("B/sub/app", "b"));
        assert!(in_subtree("b/sub", "B/Sub"));
        assert!(!in_subtree("bb/app", "b"));
        assert!(!in_subtree("a/b", "b"));
        assert!(!in_subtree("", "b"));
        assert!(!in_subtree("b", "b/sub"));
    }

    #[test]
    fn a_membership_in_another_group_is_forbidden() {
        let footprint = Footprint {
            groups: vec![(1, true)],
            users: vec![7],
            ..Default::default()
        };
        let mirror = located(&[(Kind::Group, 1, "a"), (Kind::User, 7, "")]);
        assert!(matches!(
            decide("b", &footprint, &mirror),
            Verdict::Forbidden(reason) if reason.contains("group 1 is at a")
        ));
        let mirror = located(&[(Kind::Group, 1, "b/sub"), (Kind::User, 7, "")]);
        assert_eq!(decide("b", &footprint, &mirror), Verdict::Allowed);
        // An unknown user, an unknown group: nothing to do, not a refusal.
        let mirror = located(&[(Kind::Group, 1, "b/sub")]);
        assert!(matches!(
            decide("b", &footprint, &mirror),
            Verdict::Unapplied(_)
        ));
        let mirror = located(&[(Kind::User, 7, "")]);
        assert!(matches!(
            decide("b", &footprint, &mirror),
            Verdict::Unapplied(_)
        ));
    }

    #[test]
    fn a_move_needs_both_ends_inside() {
        let transfer = |to: &str, from: &str| Footprint {
            paths: vec![
                ("path_with_namespace", to.into()),
                ("old_path_with_namespace", from.into()),
            ],
            projects: vec![(5, false)],
            ..Default::default()
        };
        let mirror = located(&[(Kind::Project, 5, "b/app")]);
        assert_eq!(
            decide("b", &transfer("b/sub/app", "b/app"), &mirror),
            Verdict::Allowed
        );
        assert!(matches!(
            decide("b", &transfer("a/app", "b/app"), &mirror),
            Verdict::Forbidden(_)
        ));
        // The payload's old path is not taken on its word: the mirror's is checked too.
        let elsewhere = located(&[(Kind::Project, 5, "a/app")]);
        assert!(matches!(
            decide("b", &transfer("b/app", "b/app"), &elsewhere),
            Verdict::Forbidden(reason) if reason.contains("project 5 is at a/app")
        ));
        // A project new to the mirror, created inside: allowed.
        assert_eq!(
            decide("b", &transfer("b/new", "b/new"), &Located::default()),
            Verdict::Allowed
        );
    }

    #[test]
    fn deployments_and_jobs_are_placed_by_their_projects() {
        let footprint = Footprint {
            paths: vec![("project.path_with_namespace", "b/app".into())],
            projects: vec![(5, false)],
            deployments: vec![9],
            jobs: vec![11],
            ..Default::default()
        };
        let inside = located(&[(Kind::Project, 5, "b/app"), (Kind::Deployment, 9, "b/app")]);
        assert_eq!(decide("b", &footprint, &inside), Verdict::Allowed);
        let other_deployment = located(&[(Kind::Deployment, 9, "a/app")]);
        assert!(matches!(
            decide("b", &footprint, &other_deployment),
            Verdict::Forbidden(_)
        ));
        // A job whose project the mirror lacks is in no subtree.
        let unplaced_job = located(&[(Kind::Job, 11, "")]);
        assert!(matches!(
            decide("b", &footprint, &unplaced_job),
            Verdict::Forbidden(reason) if reason.contains("does not know")
        ));
    }

    #[test]
    fn what_belongs_to_the_instance_is_forbidden() {
        let footprint = Footprint {
            instance_wide: Some("a user_create event"),
            ..Default::default()
        };
        assert!(matches!(
            decide("b", &footprint, &Located::default()),
            Verdict::Forbidden(_)
        ));
    }
}
