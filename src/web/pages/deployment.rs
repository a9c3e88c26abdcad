//! A deployment (SPEC 10): what it changed in the cluster against the previous snapshot
//! (resources added, removed, modified with their RFC 6902 patch, images per container), how
//! long its rollout took to become healthy, its health when settled and the environment's now.

use chrono::{DateTime, Utc};
use maud::{html, Markup};
use serde_json::Value;

use super::environment::resource_href;
use super::{environment_href, group_href, health_badge, page, query, Chrome};
use crate::web::data::{
    Changes, DeploymentDetail, GroupHealth, Resource, Snapshot, SnapshotStatus, SnapshotSummary,
};
use crate::web::order::{ago, short_sha, title};
use crate::web::yaml::to_yaml;

pub fn deployment_href(project: &str, iid: &str) -> String {
    format!(
        "/deployments{}",
        query(&[("project", project), ("iid", iid)])
    )
}

/// "42 s", "3 min 5 s", "1 h 2 min": a time to healthy as people say it.
pub fn duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "unknown".to_owned();
    }
    if seconds < 1.0 {
        return "under 1 s".to_owned();
    }
    if seconds < 10.0 {
        return format!("{seconds:.1} s");
    }
    let s = seconds.round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 if s.is_multiple_of(60) => format!("{} min", s / 60),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// What a list of deployments says of one's time to healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeToHealthy {
    /// Healthy after this long.
    Healthy(String),
    /// Snapshotted while PROGRESSING; not settled yet.
    Settling,
    /// Settled (left PROGRESSING, or the timeout passed) without becoming healthy.
    NotHealthy(String),
    /// No snapshot, and why (pending, retrying, superseded, …); `None` when there is no
    /// snapshot to expect (no agent, not successful, or kept no longer).
    NoSnapshot(Option<&'static str>),
    /// The viewer may not read the agent's resources.
    Hidden,
}

/// Pure: the time-to-healthy cell of a deployment from what was read of it. `refused` when the
/// API refused the snapshot (no `user_access`).
pub fn time_to_healthy(
    snapshot: Option<&SnapshotSummary>,
    status: Option<&SnapshotStatus>,
    refused: bool,
) -> TimeToHealthy {
    if refused {
        return TimeToHealthy::Hidden;
    }
    match snapshot {
        Some(s) => match (s.time_to_healthy, &s.settled_at) {
            (Some(t), _) => TimeToHealthy::Healthy(duration(t)),
            (None, None) => TimeToHealthy::Settling,
            (None, Some(_)) => TimeToHealthy::NotHealthy(title(&s.health)),
        },
        None => TimeToHealthy::NoSnapshot(status.and_then(|s| match s.state.as_str() {
            "PENDING" => Some("snapshot pending"),
            "RETRYING" => Some("cluster unreadable, retrying"),
            "SUPERSEDED" => Some("a newer deployment came first"),
            "FAILED" => Some("the cluster could not be read"),
            _ => None,
        })),
    }
}

pub fn time_to_healthy_cell(cell: &TimeToHealthy) -> Markup {
    html! {
        @match cell {
            TimeToHealthy::Healthy(t) => span.badge.h-healthy { (t) },
            TimeToHealthy::Settling => span.badge.h-progressing { "settling…" },
            TimeToHealthy::NotHealthy(h) => { span.badge.h-degraded { "not healthy" } span.msg { (h) " when settled" } },
            TimeToHealthy::NoSnapshot(None) => span.msg { "no snapshot" },
            TimeToHealthy::NoSnapshot(Some(why)) => { span.msg { "no snapshot: " (why) } },
            TimeToHealthy::Hidden => span.msg { "needs access to the agent" },
        }
    }
}

pub struct DeploymentView {
    pub project_path: String,
    pub deployment: DeploymentDetail,
    /// Why the snapshot and changes are not shown (no `user_access`, …).
    pub history_error: Option<String>,
    /// Why the environment's health now is not shown.
    pub health_error: Option<String>,
}

pub fn deployment_page(chrome: &Chrome, view: &DeploymentView, now: DateTime<Utc>) -> Markup {
    let d = &view.deployment;
    let project = view.project_path.as_str();
    let group_path = project.rsplit_once('/').map(|(g, _)| g);
    let iid = d.iid.as_deref().unwrap_or("?");
    let env = d.environment.as_ref();
    page(
        chrome,
        html! {
            nav.crumbs aria-label="Breadcrumb" {
                a href="/" { "Groups" }
                @if let Some(g) = group_path { " / " a href=(group_href(g)) { (g) } }
                " / " (project.rsplit('/').next().unwrap_or(project))
                @if let Some(e) = env { " / " a href=(environment_href(project, &e.name)) { (e.name) } }
            }
            h1 { "Deployment #" (iid) }
            dl.summary {
                @if let Some(e) = env { div { dt { "Environment" } dd { a href=(environment_href(project, &e.name)) { (e.name) } } } }
                div { dt { "Status" } dd { @let s = d.status.as_deref().unwrap_or("unknown"); span class={"badge s-" (s.to_ascii_lowercase())} { (title(s)) } } }
                div { dt { "Ref and commit" } dd { @if let Some(r) = &d.git_ref { span.mono { (r) } } " " @if let Some(s) = &d.sha { span.mono { (short_sha(s)) } } } }
                div { dt { "Agent and namespace" } dd { @if let Some(a) = &d.agent { span.mono { (a.name) } " · " span.mono { (a.kubernetes_namespace) } } @else { "No agent" } } }
                @let t = d.finished_at.as_deref().or(d.created_at.as_deref());
                @if let Some(t) = t { div { dt { "Finished" } dd { time datetime=(t) { (ago(t, now)) } } } }
            }
            h2 { "Rollout" }
            (rollout(view, now))
            @if let Some(changes) = &d.changes {
                (changes_view(changes, project, env.map(|e| e.name.as_str()), now))
            }
        },
    )
}

fn status_notice(status: Option<&SnapshotStatus>, has_agent: bool, now: DateTime<Utc>) -> Markup {
    html! {
        @match status.map(|s| s.state.as_str()) {
            Some("PENDING") => p.notice { "The snapshot of this deployment's resources is being taken." },
            Some("RETRYING") => div.notice.error role="alert" {
                strong { "No snapshot yet: the cluster could not be read" }
                @if let Some(s) = status {
                    " (" (s.attempts) " attempt" (if s.attempts == 1 { "" } else { "s" }) ")"
                    @if let Some(e) = &s.last_error { span.msg { (e) } }
                    @if let Some(t) = &s.next_attempt_at { span.msg { "Next attempt " time datetime=(t) { (until(t, now)) } "." } }
                }
            },
            Some("SUPERSEDED") => p.empty { "No snapshot: a newer deployment of the environment succeeded before this one's resources were read, so the cluster showed that one." },
            Some("FAILED") => div.notice.error role="alert" {
                strong { "No snapshot: the cluster could not be read in time" }
                @if let Some(e) = status.and_then(|s| s.last_error.as_deref()) { span.msg { (e) } }
            },
            _ if has_agent => p.empty { "No snapshot: envlens keeps the snapshots of an environment's newest deployments, and of successful ones only." },
            _ => p.empty { "No snapshot: this deployment did not go through an agent, so envlens cannot see what it changed." },
        }
    }
}

/// "in 12 s" for a time to come, "now" when it has passed.
fn until(time: &str, now: DateTime<Utc>) -> String {
    match DateTime::parse_from_rfc3339(time) {
        Ok(t) => {
            let seconds = (t.with_timezone(&Utc) - now).num_seconds();
            match seconds {
                s if s <= 0 => "now".to_owned(),
                s => format!("in {}", duration(s as f64)),
            }
        }
        Err(_) => time.to_owned(),
    }
}

fn health_now(health: Option<&GroupHealth>, error: Option<&str>) -> Markup {
    html! {
        @if let Some(h) = health {
            (health_badge(Some(&h.health)))
            @if let Some(m) = &h.health_message { span.msg { (m) } }
        } @else if let Some(e) = error {
            span.msg { (e) }
        } @else {
            span.msg { "No resources to show" }
        }
    }
}

fn rollout(view: &DeploymentView, now: DateTime<Utc>) -> Markup {
    let d = &view.deployment;
    let now_health = d
        .environment
        .as_ref()
        .and_then(|e| e.resource_group.as_ref());
    // The live resources are the environment's last successful deployment's: their cause is
    // this deployment's only when it is that one (SPEC 17).
    let current = d.iid.is_some()
        && d.environment
            .as_ref()
            .and_then(|e| e.last_deployment.as_ref())
            .and_then(|l| l.iid.as_ref())
            == d.iid.as_ref();
    let became_healthy = d
        .snapshot
        .as_ref()
        .is_some_and(|s| s.time_to_healthy.is_some());
    let causes = now_health.map_or(&[][..], |g| g.causes.as_slice());
    html! {
        (super::causes::of_deployment(causes, current, became_healthy))
        @if let Some(why) = &view.history_error {
            p.notice.error role="alert" { (why) }
        } @else if let Some(s) = &d.snapshot {
            (snapshot_summary(s, now_health, view.health_error.as_deref(), now))
        } @else {
            (status_notice(d.snapshot_status.as_ref(), d.agent.is_some(), now))
        }
        @if d.snapshot.is_none() || view.history_error.is_some() {
            dl.summary { div { dt { "Environment's health now" } dd { (health_now(now_health, view.health_error.as_deref())) } } }
        }
    }
}

fn snapshot_summary(
    s: &Snapshot,
    now_health: Option<&GroupHealth>,
    health_error: Option<&str>,
    now: DateTime<Utc>,
) -> Markup {
    let settled = s.settled_at.is_some();
    html! {
        dl.summary {
            div { dt { "Time to healthy" } dd {
                @match (s.time_to_healthy, settled) {
                    (Some(t), _) => strong { (duration(t)) },
                    (None, false) => span.badge.h-progressing { "settling…" },
                    (None, true) => span.badge.h-degraded { "not healthy when settled" },
                }
            } }
            div { dt { (if settled { "Health when settled" } else { "Health when deployed" }) } dd {
                (health_badge(Some(&s.health)))
                @if let Some(m) = &s.health_message { span.msg { (m) } }
            } }
            div { dt { "Environment's health now" } dd { (health_now(now_health, health_error)) } }
            div { dt { "Snapshot taken" } dd { time datetime=(s.taken_at) { (ago(&s.taken_at, now)) } } }
            @if let Some(t) = &s.settled_at { div { dt { "Settled" } dd { time datetime=(t) { (ago(t, now)) } } } }
        }
        @if !s.errors.is_empty() {
            div.notice.error role="alert" {
                strong { "Kinds not shown: the snapshot could not read them, or you may not list them now (nor their changes)" }
                ul { @for e in &s.errors {
                    li { span.mono { (e.kind) " (" (e.api_version) ")" } @if let Some(c) = e.code { " · " (c) } ": " (e.message) }
                } }
            }
        }
    }
}

fn resource_name(r: &Resource, link: Option<(&str, &str)>) -> Markup {
    html! {
        span.msg { (r.kind) " · " (r.api_version) }
        @match link {
            Some((project, env)) => a.mono href=(resource_href(project, env, &r.uid)) { (r.name) },
            None => span.mono { (r.name) },
        }
    }
}

fn changes_view(c: &Changes, project: &str, env: Option<&str>, now: DateTime<Utc>) -> Markup {
    let link = env.map(|e| (project, e));
    let total = c.added.len() + c.removed.len() + c.modified.len();
    html! {
        h2 { "Changes" }
        p.sub {
            @match &c.since {
                Some(since) => {
                    "Compared with "
                    @let iid = since.iid.as_deref().unwrap_or("?");
                    a href=(deployment_href(project, iid)) { "deployment #" (iid) }
                    @if let Some(s) = &since.sha { " (" span.mono { (short_sha(s)) } ")" }
                    @let t = since.finished_at.as_deref().or(since.created_at.as_deref());
                    @if let Some(t) = t { ", " time datetime=(t) { (ago(t, now)) } }
                    ": "
                }
                None => "The first snapshot of the environment: everything is new. ",
            }
            (c.added.len()) " added, " (c.removed.len()) " removed, " (c.modified.len()) " modified."
        }
        @if !c.images.is_empty() {
            h3 { "Images" }
            div.table-wrap { table.stack {
                caption.skip { "Images changed, per container" }
                thead { tr { th scope="col" { "Resource" } th scope="col" { "Container" } th scope="col" { "Before" } th scope="col" { "After" } } }
                tbody { @for i in &c.images {
                    tr.image {
                        td data-label="Resource" { (resource_name(&i.resource, link)) }
                        td data-label="Container" { span.mono { (i.container) } }
                        td data-label="Before" { @match &i.before { Some(b) => del.mono { (b) }, None => span.msg { "(added)" } } }
                        td data-label="After" { @match &i.after { Some(a) => ins.mono { (a) }, None => span.msg { "(removed)" } } }
                    }
                } }
            } }
        }
        @if total == 0 {
            p.empty { "Nothing changed in the resources." }
        }
        @if !c.added.is_empty() {
            h3 { "Added" }
            ul.changes { @for r in &c.added { li { span.badge.h-healthy { "added" } " " (resource_name(r, link)) } } }
        }
        @if !c.removed.is_empty() {
            h3 { "Removed" }
            ul.changes { @for r in &c.removed { li { span.badge.h-degraded { "removed" } " " (resource_name(r, None)) } } }
        }
        @if !c.modified.is_empty() {
            h3 { "Modified" }
            @for m in &c.modified {
                section.modified aria-label={"Changes to " (m.resource.kind) " " (m.resource.name)} {
                    p { span.badge.h-progressing { "modified" } " " (resource_name(&m.resource, link)) }
                    (patch_table(&m.patch))
                }
            }
        }
    }
}

/// One row per RFC 6902 operation: what, where, and the new value (YAML for a structure).
fn patch_table(ops: &[Value]) -> Markup {
    html! {
        div.table-wrap { table.stack.patch {
            caption.skip { "The patch from before to after (RFC 6902)" }
            thead { tr { th scope="col" { "Operation" } th scope="col" { "Path" } th scope="col" { "Value" } } }
            tbody { @for op in ops {
                @let verb = op.get("op").and_then(Value::as_str).unwrap_or("?");
                tr {
                    td data-label="Operation" { span.mono { (verb) } }
                    td data-label="Path" { code.path { (op.get("path").and_then(Value::as_str).unwrap_or("")) } }
                    td data-label="Value" {
                        @match op.get("value") {
                            None => span.msg { (if verb == "remove" { "(removed)" } else { "" }) },
                            Some(Value::String(s)) => code { (s) },
                            Some(v @ (Value::Object(_) | Value::Array(_))) => pre.yaml.small { (to_yaml(v)) },
                            Some(v) => code { (v) },
                        }
                    }
                }
            } }
        } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(settled: bool, ttl: Option<f64>, health: &str) -> SnapshotSummary {
        SnapshotSummary {
            settled_at: settled.then(|| "2026-11-24T12:00:00Z".to_owned()),
            health: health.into(),
            time_to_healthy: ttl,
        }
    }

    fn status(state: &str) -> SnapshotStatus {
        SnapshotStatus {
            state: state.into(),
            attempts: 0,
            last_error: None,
            next_attempt_at: None,
        }
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(duration(0.0), "under 1 s");
        assert_eq!(duration(4.25), "4.2 s");
        assert_eq!(duration(42.4), "42 s");
        assert_eq!(duration(180.0), "3 min");
        assert_eq!(duration(185.0), "3 min 5 s");
        assert_eq!(duration(3720.0), "1 h 2 min");
        assert_eq!(duration(f64::NAN), "unknown");
    }

    #[test]
    fn the_time_to_healthy_says_honestly_what_is_known() {
        let healthy = summary(true, Some(42.0), "HEALTHY");
        assert_eq!(
            time_to_healthy(Some(&healthy), None, false),
            TimeToHealthy::Healthy("42 s".into())
        );
        let rolling = summary(false, None, "PROGRESSING");
        assert_eq!(
            time_to_healthy(Some(&rolling), None, false),
            TimeToHealthy::Settling
        );
        let stuck = summary(true, None, "DEGRADED");
        assert_eq!(
            time_to_healthy(Some(&stuck), None, false),
            TimeToHealthy::NotHealthy("Degraded".into())
        );
        assert_eq!(
            time_to_healthy(None, Some(&status("RETRYING")), false),
            TimeToHealthy::NoSnapshot(Some("cluster unreadable, retrying"))
        );
        assert_eq!(
            time_to_healthy(None, Some(&status("PENDING")), false),
            TimeToHealthy::NoSnapshot(Some("snapshot pending"))
        );
        assert_eq!(
            time_to_healthy(None, None, false),
            TimeToHealthy::NoSnapshot(None)
        );
        assert_eq!(
            time_to_healthy(Some(&healthy), None, true),
            TimeToHealthy::Hidden
        );
    }

    #[test]
    fn a_patch_reads_as_operations_paths_and_values() {
        let html = patch_table(&[
            serde_json::json!({"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "web:2"}),
            serde_json::json!({"op": "remove", "path": "/data/old"}),
            serde_json::json!({"op": "add", "path": "/data/new", "value": {"a": 1}}),
        ])
        .into_string();
        assert!(html.contains("<code>web:2</code>"), "{html}");
        assert!(
            html.contains("/spec/template/spec/containers/0/image"),
            "{html}"
        );
        assert!(html.contains("(removed)"), "{html}");
        assert!(html.contains("a: 1"), "{html}");
    }
}
