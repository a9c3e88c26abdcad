//! The groups a user can read, and one group's environments.

use std::cmp::Reverse;

use chrono::{DateTime, Utc};
use maud::{html, Markup};

use super::{environment_href, group_href, health_badge, page, Chrome};
use crate::web::data::EnvironmentSummary;
use crate::web::order::{ago, health_rank, short_sha, tier_rank, title, TIERS};

/// An environment's health as the group pages show it.
#[derive(Debug, Clone)]
pub enum HealthCell {
    /// No successful deployment with an agent: nothing to look at in a cluster.
    NoAgent,
    Status {
        status: String,
        message: Option<String>,
    },
    /// The resource group could not be read (no access to the agent, cluster away).
    Unavailable(String),
}

impl HealthCell {
    /// For sorting, worst first: an unreadable group before any health, no agent last.
    fn rank(&self) -> u8 {
        match self {
            HealthCell::NoAgent => 0,
            HealthCell::Status { status, .. } => health_rank(status),
            HealthCell::Unavailable(_) => 7,
        }
    }

    fn badge(&self) -> Markup {
        match self {
            HealthCell::NoAgent => html! { span.badge.h-none { "Not deployed" } },
            HealthCell::Status { status, .. } => health_badge(Some(status)),
            HealthCell::Unavailable(_) => html! { span.badge.h-unknown { "Unavailable" } },
        }
    }

    fn message(&self) -> Option<&str> {
        match self {
            HealthCell::NoAgent => None,
            HealthCell::Status { message, .. } => message.as_deref(),
            HealthCell::Unavailable(why) => Some(why),
        }
    }
}

pub struct GroupCard {
    pub full_path: String,
    /// Its production environments, worst first.
    pub environments: Vec<(EnvironmentSummary, HealthCell)>,
    /// Production environments not shown.
    pub more: bool,
}

/// `/`: the groups, each with the health of its production environments.
pub fn groups_page(chrome: &Chrome, mut cards: Vec<GroupCard>) -> Markup {
    for card in &mut cards {
        card.environments.sort_by_key(|(e, h)| {
            (
                Reverse(h.rank()),
                e.project.full_path.clone(),
                e.name.clone(),
            )
        });
    }
    page(
        chrome,
        html! {
            h1 { "Your groups" }
            p.sub { "The health of each group's production environments, worst first. Open a group for all its environments." }
            div #groups data-live-region {
                @if cards.is_empty() {
                    p.empty { "You are not a member of any group with projects yet. Ask a group's owner to add you, or sign in as another user." }
                }
                ul.cards {
                    @for card in &cards {
                        li.card {
                            h2 { a href=(group_href(&card.full_path)) { (card.full_path) } }
                            @if card.environments.is_empty() {
                                p.msg { "No production environments." }
                            } @else {
                                @let bad = card.environments.iter().filter(|(_, h)| h.rank() > health_rank("HEALTHY")).count();
                                p.msg {
                                    (card.environments.len()) " production environment" (if card.environments.len() == 1 { "" } else { "s" })
                                    @if bad > 0 { ", " strong { (bad) " need" (if bad == 1 { "s" } else { "" }) " attention" } }
                                    @if card.more { " (first 20 shown)" }
                                }
                                ul.dots aria-label={"Production environments of " (card.full_path)} {
                                    @for (env, health) in &card.environments {
                                        li {
                                            a href=(environment_href(&env.project.full_path, &env.name))
                                              title=[health.message()] {
                                                (health.badge()) " "
                                                span.mono { (env.project.full_path.rsplit('/').next().unwrap_or("")) "/" (env.name) }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

pub struct GroupView {
    pub full_path: String,
    pub rows: Vec<(EnvironmentSummary, HealthCell)>,
    /// The filter as asked, in the URL's spelling.
    pub tier: Option<String>,
    pub search: String,
    /// More environments matched than are shown.
    pub truncated: bool,
}

/// Production first, worst health first, then by project and name.
pub fn sort_rows(rows: &mut [(EnvironmentSummary, HealthCell)]) {
    rows.sort_by_key(|(e, h)| {
        (
            tier_rank(e.tier.as_deref()),
            Reverse(h.rank()),
            e.project.full_path.clone(),
            e.name.clone(),
        )
    });
}

/// `/groups/<path>`: every environment of the group's projects and subgroups.
pub fn group_page(chrome: &Chrome, mut view: GroupView, now: DateTime<Utc>) -> Markup {
    sort_rows(&mut view.rows);
    let parents: Vec<&str> = view.full_path.split('/').collect();
    page(
        chrome,
        html! {
            nav.crumbs aria-label="Breadcrumb" {
                a href="/" { "Groups" }
                @for i in 0..parents.len().saturating_sub(1) {
                    " / " a href=(group_href(&parents[..=i].join("/"))) { (parents[i]) }
                }
            }
            h1 { (view.full_path) }
            form.filters method="get" role="search" aria-label="Filter environments" {
                label for="tier" { "Tier"
                    select #tier name="tier" {
                        option value="" selected[view.tier.is_none()] { "All tiers" }
                        @for t in TIERS {
                            option value=(t) selected[view.tier.as_deref() == Some(t)] { (title(t)) }
                        }
                    }
                }
                label for="search" { "Environment name"
                    input #search type="search" name="search" value=(view.search) placeholder="e.g. review";
                }
                button type="submit" { "Filter" }
                @if view.tier.is_some() || !view.search.is_empty() {
                    a.button href=(group_href(&view.full_path)) { "Clear" }
                }
            }
            div #environments data-live-region {
                @if view.rows.is_empty() {
                    p.empty { "No environments match." }
                } @else {
                    p.sub { (view.rows.len()) " environment" (if view.rows.len() == 1 { "" } else { "s" }) ", production first, worst health first"
                        @if view.truncated { " (the first " (view.rows.len()) "; narrow the search for the rest)" } "." }
                    div.table-wrap {
                        table.stack {
                            caption.skip { "Environments of " (view.full_path) }
                            thead { tr {
                                th scope="col" { "Environment" } th scope="col" { "Health" }
                                th scope="col" { "Last deployment" } th scope="col" { "Agent and namespace" }
                            } }
                            tbody {
                                @for (env, health) in &view.rows {
                                    tr class=[env.tier.as_deref().filter(|t| t.eq_ignore_ascii_case("production")).map(|_| "production")] {
                                        td data-label="Environment" {
                                            a href=(environment_href(&env.project.full_path, &env.name)) { strong { (env.name) } }
                                            " "
                                            @if let Some(t) = &env.tier { span class={"badge t-" (t.to_ascii_lowercase())} { (title(t)) } }
                                            span.msg { (env.project.full_path) @if env.state != "available" { " · " (env.state) } }
                                        }
                                        td data-label="Health" {
                                            (health.badge())
                                            @if let Some(m) = health.message() { span.msg { (m) } }
                                        }
                                        td data-label="Last deployment" {
                                            @if let Some(d) = env.deployments.nodes.first() {
                                                @let status = d.status.as_deref().unwrap_or("unknown");
                                                span class={"badge s-" (status.to_ascii_lowercase())} { (title(status)) }
                                                " "
                                                @if let Some(iid) = &d.iid { "#" (iid) " " }
                                                @if let Some(r) = &d.git_ref { span.mono { (r) } " " }
                                                @if let Some(sha) = &d.sha { span.mono { (short_sha(sha)) } }
                                                @let when = d.finished_at.as_deref().or(d.created_at.as_deref());
                                                @if let Some(t) = when { span.msg { time datetime=(t) { (ago(t, now)) } } }
                                            } @else {
                                                span.msg { "Never deployed" }
                                            }
                                        }
                                        td data-label="Agent and namespace" {
                                            @match (&env.cluster_agent, &env.kubernetes_namespace) {
                                                (Some(a), Some(ns)) => { span.mono { (super::agent::agent_link(a)) } span.msg { "namespace " (ns) } }
                                                _ => span.msg { "No agent: not deployed to a cluster" },
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::data::{Nodes, ProjectRef};

    fn env(name: &str, tier: Option<&str>) -> EnvironmentSummary {
        EnvironmentSummary {
            id: name.into(),
            name: name.into(),
            tier: tier.map(Into::into),
            state: "available".into(),
            project: ProjectRef {
                full_path: "g/p".into(),
            },
            kubernetes_namespace: None,
            cluster_agent: None,
            deployments: Nodes { nodes: vec![] },
        }
    }

    fn status(s: &str) -> HealthCell {
        HealthCell::Status {
            status: s.into(),
            message: None,
        }
    }

    #[test]
    fn production_first_then_worst_health_first() {
        let mut rows = vec![
            (env("review", None), HealthCell::NoAgent),
            (env("staging", Some("STAGING")), status("DEGRADED")),
            (env("prod-ok", Some("PRODUCTION")), status("HEALTHY")),
            (env("prod-bad", Some("PRODUCTION")), status("DEGRADED")),
            (
                env("prod-unreadable", Some("PRODUCTION")),
                HealthCell::Unavailable("no access".into()),
            ),
        ];
        sort_rows(&mut rows);
        let names: Vec<&str> = rows.iter().map(|(e, _)| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "prod-unreadable",
                "prod-bad",
                "prod-ok",
                "staging",
                "review"
            ]
        );
    }

    #[test]
    fn names_are_escaped_and_the_filter_is_a_plain_form() {
        let chrome = Chrome {
            title: "g",
            username: Some("<b>"),
            csrf: Some("t"),
            subscription: None,
        };
        let view = GroupView {
            full_path: "g".into(),
            rows: vec![(
                env("<script>x</script>", Some("PRODUCTION")),
                status("HEALTHY"),
            )],
            tier: Some("production".into()),
            search: "\"q".into(),
            truncated: false,
        };
        let html = group_page(&chrome, view, chrono::Utc::now()).into_string();
        assert!(!html.contains("<script>x"), "{html}");
        assert!(html.contains("&lt;script&gt;x"));
        assert!(
            html.contains(r#"<form class="filters" method="get""#),
            "{html}"
        );
        assert!(
            html.contains(r#"<option value="production" selected>"#),
            "{html}"
        );
        assert!(html.contains("value=\"&quot;q\""), "{html}");
    }
}
