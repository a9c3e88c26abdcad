//! An agent: its connection and what each status means, how it reaches the cluster
//! (`access_as`), whom its `user_access` and `ci_access` name, and the environments it serves.

use chrono::{DateTime, Utc};
use maud::{html, Markup};

use super::deployment::deployment_href;
use super::environment::connection;
use super::{environment_href, group_href, page, Chrome};
use crate::db::read_agents::{AgentEnvironmentRow, AgentGrantRow};
use crate::gitlab::access::AccessAs;
use crate::web::data::{AgentConnection, AgentRef};
use crate::web::order::{ago, short_sha, title};

/// How often the page re-renders its regions: the connection is read from memory, so a
/// refresh asks no cluster (`dashboard.js`, `data-refresh-every`).
pub const REFRESH_SECONDS: u32 = 10;

pub struct AgentView<'a> {
    pub project_path: &'a str,
    pub name: &'a str,
    pub connection: AgentConnection,
    /// The `user_access` section's; `None` when it names nobody or says no `access_as`.
    pub access_as: Option<AccessAs>,
    /// The groups and projects its sections name that the viewer sees.
    pub grants: &'a [AgentGrantRow],
    pub environments: &'a [AgentEnvironmentRow],
    /// Whether more environments matched than are listed.
    pub truncated: bool,
}

pub fn agent_href(project: &str, name: &str) -> String {
    format!(
        "/agents{}",
        super::query(&[("project", project), ("name", name)])
    )
}

/// An agent's name, linked to its page when its project is known.
pub fn agent_link(a: &AgentRef) -> Markup {
    html! {
        @match &a.project {
            Some(p) => a href=(agent_href(&p.full_path, &a.name)) { (a.name) },
            None => (a.name),
        }
    }
}

/// Each status of `ClusterAgent.connection` (SPEC 14), in the words a user needs to act on it.
pub const STATUS_MEANINGS: [(&str, &str); 6] = [
    ("CONNECTED", "The cluster answered envlens' last request through this connection."),
    ("AGENT_NOT_CONNECTED", "agentk is not connected to GitLab's agent server: check the agentk Pod in the cluster and its logs. Views show what envlens saw last, and catch up when the agent is back."),
    ("TOKEN_REFUSED", "GitLab's agent server refused envlens' k8s_proxy token: it is revoked or expired, lacks the k8s_proxy scope, or its user is not a Developer of a group or project this agent's user_access lists."),
    ("UNREACHABLE", "Nothing answered: the cluster's or the agent server's address cannot be reached, or GitLab's agent server cannot be used (disabled, or no token configured)."),
    ("NOT_CONFIGURED", "envlens has no way to this cluster: no kubernetes.agents entry names the agent, and gitlab.kas is not configured."),
    ("NOT_CHECKED", "envlens has not asked this cluster anything yet; it will when someone views an environment the agent serves."),
];

fn access_as(a: Option<AccessAs>) -> Markup {
    html! {
        @match a {
            Some(AccessAs::Agent) => {
                span.mono { "agent" }
                span.msg { "The agent's own identity: whoever user_access admits sees what the agent's service account may see." }
            }
            Some(AccessAs::User) => {
                span.mono { "user" }
                span.msg { "Each viewer's GitLab identity: the cluster's RBAC for gitlab:user:<username> and their groups decides what each one sees." }
            }
            None => {
                "Not set"
                span.msg { "user_access admits nobody: only CI/CD jobs (ci_access) use this agent." }
            }
        }
    }
}

/// The groups and projects of one section, groups linked to their pages.
fn grants(rows: &[AgentGrantRow], section: &str) -> Markup {
    let rows: Vec<&AgentGrantRow> = rows.iter().filter(|g| g.section == section).collect();
    html! {
        @if rows.is_empty() {
            p.empty { "None that you may see." }
        } @else {
            ul.grants {
                @for g in rows {
                    li {
                        span.msg { (title(&g.kind)) }
                        @if g.kind == "group" {
                            a.mono href=(group_href(&g.full_path)) { (g.full_path) }
                        } @else {
                            span.mono { (g.full_path) }
                        }
                    }
                }
            }
        }
    }
}

fn environments(view: &AgentView, now: DateTime<Utc>) -> Markup {
    html! {
        @if view.environments.is_empty() {
            p.empty { "No environment that you may read was last deployed through this agent." }
        } @else {
            div.table-wrap { table.stack {
                caption.skip { "Environments last deployed through this agent" }
                thead { tr { th scope="col" { "Environment" } th scope="col" { "Namespace" } th scope="col" { "Last deployment" } } }
                tbody { @for e in view.environments {
                    tr {
                        td data-label="Environment" {
                            a href=(environment_href(&e.project_full_path, &e.name)) { (e.name) }
                            span.msg { (e.project_full_path) @if let Some(t) = &e.tier { " · " (title(t)) } }
                        }
                        td data-label="Namespace" { span.mono { (e.kubernetes_namespace) } }
                        td data-label="Last deployment" {
                            @if let Some(status) = &e.status {
                                span class={"badge s-" (status.to_ascii_lowercase())} { (title(status)) }
                                " "
                                @if let Some(iid) = e.iid { a href=(deployment_href(&e.project_full_path, &iid.to_string())) { "#" (iid) } " " }
                                @if let Some(r) = &e.git_ref { span.mono { (r) } " " }
                                @if let Some(sha) = &e.sha { span.mono { (short_sha(sha)) } }
                                @if let Some(t) = e.finished_at.or(e.created_at) {
                                    @let t = t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                                    span.msg { time datetime=(t) { (ago(&t, now)) } }
                                }
                            }
                        }
                    }
                } }
            } }
            @if view.truncated { p.msg { "The first " (view.environments.len()) " by project and name." } }
        }
    }
}

pub fn agent_page(chrome: &Chrome, view: &AgentView, now: DateTime<Utc>) -> Markup {
    let status = view.connection.status.as_str();
    page(
        chrome,
        html! {
            nav.crumbs aria-label="Breadcrumb" {
                a href="/" { "Groups" } " / Agents / " (view.project_path)
            }
            h1 { "Agent " (view.name) }
            div #agent-summary data-live-region data-refresh-every=(REFRESH_SECONDS) {
                dl.summary {
                    div { dt { "Project" } dd.mono { (view.project_path) } }
                    div { dt { "Connection" } dd #agent-connection { (connection(&view.connection, now)) } }
                    div { dt { "Access as" } dd #access-as { (access_as(view.access_as)) } }
                }
                h2 { "What the connection's status means" }
                dl.meanings {
                    @for (name, meaning) in STATUS_MEANINGS {
                        @let current = name == status;
                        div class=[current.then_some("current")] aria-current=[current.then_some("true")] {
                            dt { span class={"badge " (if name == "CONNECTED" { "h-healthy" } else if name == "NOT_CHECKED" { "h-none" } else { "h-degraded" })} { (title(&name.replace('_', " "))) } @if current { " (now)" } }
                            dd { (meaning) }
                        }
                    }
                }
            }
            h2 { "Who may use it" }
            p.sub { "Only the groups and projects you may see are listed." }
            div.columns {
                section aria-labelledby="user-access" {
                    h3 #user-access { "Viewing through it (" span.mono { "user_access" } ")" }
                    (grants(view.grants, "user_access"))
                }
                section aria-labelledby="ci-access" {
                    h3 #ci-access { "Deploying through it (" span.mono { "ci_access" } ")" }
                    (grants(view.grants, "ci_access"))
                    p.msg { "The jobs of the agent's own project may deploy through it too." }
                }
            }
            h2 { "Environments" }
            div #agent-environments data-live-region { (environments(view, now)) }
        },
    )
}
