//! Why an environment is not healthy, as its pages say it (SPEC 17): the one sentence the
//! environment page leads with (the worst cause first, the others beneath it, a crash's last
//! log lines folded under it), which resources and edges lie on a cause path (marked in the tree
//! and the graph), and the cause a deployment's page names when it did not become healthy.

use std::collections::HashSet;

use maud::{html, Markup};

use super::environment::resource_href;
use crate::web::data::{Cause, Resource, ResourceGroup};
use crate::web::order::health_rank;

/// The resources and the edges (parent, child) on any cause path, by uid.
#[derive(Debug, Default)]
pub struct Marks<'a> {
    pub nodes: HashSet<&'a str>,
    pub edges: HashSet<(&'a str, &'a str)>,
}

/// What the page marks: nothing for a healthy group.
pub fn marks(group: &ResourceGroup) -> Marks<'_> {
    let mut marks = Marks::default();
    if group.health.as_deref() == Some("HEALTHY") {
        return marks;
    }
    for cause in &group.causes {
        marks.nodes.extend(cause.path.iter().map(String::as_str));
        marks.edges.extend(
            cause
                .path
                .windows(2)
                .map(|w| (w[0].as_str(), w[1].as_str())),
        );
    }
    marks
}

/// The causes, the one whose explaining resource is in the worst health first (in the API's
/// order otherwise).
fn ordered<'a>(causes: &'a [Cause], resources: &[Resource]) -> Vec<&'a Cause> {
    let rank = |cause: &Cause| {
        let leaf = cause.path.last();
        resources
            .iter()
            .find(|r| Some(&r.uid) == leaf)
            .and_then(|r| r.health.as_ref())
            .map_or(0, |h| health_rank(&h.status))
    };
    let mut ordered: Vec<&Cause> = causes.iter().collect();
    ordered.sort_by_key(|c| std::cmp::Reverse(rank(c)));
    ordered
}

/// The lead of the environment page when its group is not healthy: the worst cause's sentence,
/// the cluster's message, a link to the resource that explains it, its previous log lines, and
/// the other causes. Nothing for a healthy group or one without causes.
pub fn lead(group: &ResourceGroup, project: &str, env: &str) -> Markup {
    if group.health.as_deref() == Some("HEALTHY") || group.causes.is_empty() {
        return html! {};
    }
    let causes = ordered(&group.causes, &group.resources);
    let first = causes[0];
    let leaf = first
        .path
        .last()
        .and_then(|uid| group.resources.iter().find(|r| &r.uid == uid));
    // A group still rolling out is on its way, not broken: Argo CD shows Progressing in blue,
    // Suspended in amber, and only the rest in red.
    let tone = match group.health.as_deref() {
        Some("PROGRESSING") => "notice info cause",
        Some("SUSPENDED") => "notice cause",
        _ => "notice error cause",
    };
    html! {
        section class=(tone) #cause aria-labelledby="cause-sentence" {
            p.sentence #cause-sentence { strong { (first.sentence) } }
            @if !first.message.is_empty() && !first.sentence.contains(first.message.as_str()) {
                span.msg { "The cluster says: " (first.message) }
            }
            @if let Some(r) = leaf {
                span.msg { a href=(resource_href(project, env, &r.uid)) { "Open " (r.kind) " " (r.name) } }
            }
            @if let Some(lines) = first.log_lines.as_ref().filter(|l| !l.is_empty()) {
                details.loglines {
                    summary { "The last " (lines.len()) " lines its previous run printed" }
                    pre.logs { (lines.join("\n")) }
                }
            }
            @if causes.len() > 1 {
                details.more {
                    summary { (causes.len() - 1) " more " (if causes.len() == 2 { "cause" } else { "causes" }) }
                    ul { @for c in &causes[1..] { li { (c.sentence) } } }
                }
            }
        }
    }
}

/// A deployment's cause: the environment's live causes when the deployment is the one they are
/// of (`current`) and it has not become healthy; nothing otherwise (a later deployment's cause
/// would not be this one's).
pub fn of_deployment(causes: &[Cause], current: bool, became_healthy: bool) -> Markup {
    if !current || became_healthy || causes.is_empty() {
        return html! {};
    }
    html! {
        div.notice.error.cause #cause role="status" {
            strong { "Why it is not healthy" }
            ul { @for c in causes {
                li { span.sentence { (c.sentence) } @if !c.message.is_empty() { span.msg { "The cluster says: " (c.message) } } }
            } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::data::Health;

    fn resource(uid: &str, status: &str) -> Resource {
        Resource {
            uid: uid.into(),
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: None,
            name: uid.into(),
            created_at: None,
            health: Some(Health {
                status: status.into(),
                message: None,
            }),
            flux_sync_status: None,
            events: vec![],
            manifest: None,
        }
    }

    fn cause(path: &[&str], sentence: &str) -> Cause {
        Cause {
            path: path.iter().map(|s| s.to_string()).collect(),
            message: String::new(),
            sentence: sentence.into(),
            log_lines: None,
        }
    }

    fn group(health: &str, causes: Vec<Cause>) -> ResourceGroup {
        ResourceGroup {
            namespace: "ns".into(),
            namespaces: vec![],
            sources: vec![],
            label_selector: String::new(),
            health: Some(health.into()),
            health_message: None,
            warnings: vec![],
            errors: vec![],
            resources: vec![
                resource("a", "PROGRESSING"),
                resource("b", "DEGRADED"),
                resource("c", "HEALTHY"),
            ],
            edges: vec![],
            causes,
        }
    }

    #[test]
    fn the_worst_cause_leads_and_the_paths_are_marked() {
        let g = group(
            "DEGRADED",
            vec![cause(&["c", "a"], "slow"), cause(&["c", "b"], "broken")],
        );
        let html = lead(&g, "g/p", "production").into_string();
        let first = html.find("broken").unwrap();
        assert!(html.find("slow").unwrap() > first, "{html}");
        assert!(html.contains("1 more cause"), "{html}");
        let marks = marks(&g);
        assert_eq!(marks.nodes, HashSet::from(["a", "b", "c"]));
        assert!(marks.edges.contains(&("c", "b")));
        assert!(!marks.edges.contains(&("a", "b")));
    }

    #[test]
    fn a_group_still_progressing_leads_in_blue_not_red() {
        let tone = |health| {
            let html = lead(&group(health, vec![cause(&["a"], "rolling")]), "g/p", "e");
            let html = html.into_string();
            html[..html.find('>').unwrap()].to_owned()
        };
        assert!(tone("PROGRESSING").contains(r#"class="notice info cause""#));
        assert!(tone("SUSPENDED").contains(r#"class="notice cause""#));
        assert!(tone("DEGRADED").contains(r#"class="notice error cause""#));
        assert!(tone("UNKNOWN").contains(r#"class="notice error cause""#));
    }

    #[test]
    fn a_healthy_group_leads_with_nothing() {
        let g = group("HEALTHY", vec![cause(&["a"], "stale")]);
        assert_eq!(lead(&g, "g/p", "production").into_string(), "");
        assert!(marks(&g).nodes.is_empty());
    }

    #[test]
    fn a_deployment_names_the_cause_only_of_its_own_resources() {
        let causes = [cause(&["a"], "Deployment api: broken (X)")];
        assert!(of_deployment(&causes, true, false)
            .into_string()
            .contains("Deployment api: broken (X)"));
        assert_eq!(of_deployment(&causes, false, false).into_string(), "");
        assert_eq!(of_deployment(&causes, true, true).into_string(), "");
    }
}
