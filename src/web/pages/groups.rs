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
    /// How many of the environments (of the tier asked) have each health, among those whose
    /// health the viewer may see (`Group.environmentHealthCounts`).
    pub counts: Vec<(String, i64)>,
    /// The filter as asked, in the URL's spelling.
    pub tier: Option<String>,
    pub search: String,
    /// More environments matched than are shown.
    pub truncated: bool,
}

/// Worst health first (the unhealthy ones lead), production first among equals, then by
/// project and name.
pub fn sort_rows(rows: &mut [(EnvironmentSummary, HealthCell)]) {
    rows.sort_by_key(|(e, h)| {
        (
            Reverse(h.rank()),
            tier_rank(e.tier.as_deref()),
            e.project.full_path.clone(),
            e.name.clone(),
        )
    });
}

/// The counts by health, worst first, those with none left out; all of them sum up what the
/// viewer sees.
fn health_counts(full_path: &str, tier: Option<&str>, counts: &[(String, i64)]) -> Markup {
    let mut shown: Vec<&(String, i64)> = counts.iter().filter(|(_, n)| *n > 0).collect();
    shown.sort_by_key(|(s, _)| Reverse(health_rank(s)));
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    let unhealthy: i64 = counts
        .iter()
        .filter(|(s, _)| health_rank(s) > health_rank("HEALTHY"))
        .map(|(_, n)| n)
        .sum();
    let scope = match tier {
        Some(t) => format!("{} environments", title(t)),
        None => "Environments".to_owned(),
    };
    html! {
        section #health-counts .counts data-live-region aria-label={"Health of the environments of " (full_path)} {
            @if total == 0 {
                p.msg { "No environment health to show yet: none is deployed through an agent you may use." }
            } @else {
                p.lead {
                    @if unhealthy > 0 {
                        strong { (unhealthy) " of " (total) } " " (scope.to_lowercase()) " need" (if unhealthy == 1 { "s" } else { "" }) " attention"
                    } @else {
                        (scope) ": all " (total) " healthy"
                    }
                }
                ul.count-list {
                    @for (status, n) in shown {
                        li { (health_badge(Some(status))) " " strong.count { (n) } }
                    }
                }
            }
        }
    }
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
            (health_counts(&view.full_path, view.tier.as_deref(), &view.counts))
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
                    p.sub { (view.rows.len()) " environment" (if view.rows.len() == 1 { "" } else { "s" }) ", unhealthy first"
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
            name: name.into(),
            tier: tier.map(Into::into),
            state: "available".into(),
            project: ProjectRef {
                full_path: "g/p".into(),
            },
            kubernetes_namespace: None,
            cluster_agent: None,
            health: None,
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
    fn the_unhealthy_first_then_production_first() {
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
                "staging",
                "prod-ok",
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
            counts: vec![("HEALTHY".into(), 1)],
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
