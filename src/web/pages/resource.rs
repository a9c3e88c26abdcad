//! One resource: its health, events and manifest as YAML; for a Pod, its logs by container.

use chrono::{DateTime, Utc};
use maud::{html, Markup};

use super::{environment_href, health_badge, page, query, Chrome};
use crate::web::data::Resource;
use crate::web::order::ago;
use crate::web::yaml::to_yaml;

pub struct ResourceView<'a> {
    pub project_path: &'a str,
    pub environment: &'a str,
    pub resource: &'a Resource,
}

/// The containers of a Pod's manifest: init containers first, as they run.
pub fn containers(manifest: &serde_json::Value) -> Vec<String> {
    ["initContainers", "containers"]
        .iter()
        .flat_map(|k| {
            manifest["spec"][k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["name"].as_str().map(str::to_owned))
        })
        .collect()
}

pub fn logs_href(project: &str, environment: &str, uid: &str, container: &str) -> String {
    format!(
        "/logs{}",
        query(&[
            ("project", project),
            ("environment", environment),
            ("uid", uid),
            ("container", container),
        ])
    )
}

fn crumbs(project: &str, environment: &str) -> Markup {
    html! {
        nav.crumbs aria-label="Breadcrumb" {
            a href="/" { "Groups" } " / " (project) " / "
            a href=(environment_href(project, environment)) { (environment) }
        }
    }
}

pub fn resource_page(chrome: &Chrome, view: &ResourceView, now: DateTime<Utc>) -> Markup {
    let r = view.resource;
    let manifest = r.manifest.clone().unwrap_or_default();
    page(
        chrome,
        html! {
            (crumbs(view.project_path, view.environment))
            h1 { span.kind.msg { (r.kind) " · " (r.api_version) } (r.name) }
            div #resource data-live-region {
                dl.summary {
                    div { dt { "Health" } dd { (health_badge(r.health.as_ref().map(|h| h.status.as_str()))) } }
                    @if let Some(ns) = &r.namespace { div { dt { "Namespace" } dd.mono { (ns) } } }
                    @if let Some(t) = &r.created_at { div { dt { "Created" } dd { time datetime=(t) { (ago(t, now)) } } } }
                }
                @if let Some(m) = r.health.as_ref().and_then(|h| h.message.as_deref()) { p.msg { (m) } }
                @if r.kind == "Pod" {
                    h2 { "Logs" }
                    ul.containers aria-label="Logs by container" {
                        @for c in containers(&manifest) {
                            li { a.button href=(logs_href(view.project_path, view.environment, &r.uid, &c)) { (c) } }
                        }
                    }
                }
                h2 { "Events" }
                @if r.events.is_empty() { p.empty { "No recent events." } }
                ul { @for e in &r.events {
                    li { span class={"badge " (if e.event_type == "Warning" { "h-degraded" } else { "h-none" })} { (e.event_type) } " "
                        strong { (e.reason) } @if e.count > 1 { " ×" (e.count) } ": " (e.message)
                        @if let Some(t) = &e.last_seen { " " span.msg { time datetime=(t) { (ago(t, now)) } } } }
                } }
            }
            h2 #manifest-heading { "Manifest" }
            @if r.kind == "Secret" { p.msg { "Secret values are masked: they never leave envlens." } }
            pre.yaml tabindex="0" aria-labelledby="manifest-heading" { code { (to_yaml(&manifest)) } }
        },
    )
}

pub struct LogsView<'a> {
    pub project_path: &'a str,
    pub environment: &'a str,
    pub pod: &'a Resource,
    pub container: &'a str,
    pub containers: Vec<String>,
    /// The last lines, read when the page was rendered.
    pub tail: Result<String, String>,
    /// Where the script follows the log.
    pub follow: String,
}

pub fn logs_page(chrome: &Chrome, view: &LogsView) -> Markup {
    let pod = view.pod;
    page(
        chrome,
        html! {
            (crumbs(view.project_path, view.environment))
            h1 { span.kind.msg { "Logs of Pod" } (pod.name) }
            div.logbar {
                ul.containers aria-label="Containers" {
                    @for c in &view.containers {
                        li { a href=(logs_href(view.project_path, view.environment, &pod.uid, c))
                               aria-current=[(c == view.container).then_some("page")] { (c) } }
                    }
                }
                button #follow type="button" hidden { "Follow" }
                span #follow-state role="status" aria-live="polite" { "The last 500 lines" }
                a href=(super::resource::resource_href_for(view.project_path, view.environment, &pod.uid)) { "Manifest and events" }
            }
            @match &view.tail {
                Ok(text) => pre.logs tabindex="0" aria-label={"Log of container " (view.container)} data-follow=(view.follow) { (text) },
                Err(why) => p.notice.error role="alert" { (why) },
            }
        },
    )
}

pub fn resource_href_for(project: &str, environment: &str, uid: &str) -> String {
    super::environment::resource_href(project, environment, uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_containers_come_first() {
        let pod = serde_json::json!({"spec": {"containers": [{"name": "app"}, {"name": "proxy"}], "initContainers": [{"name": "migrate"}]}});
        assert_eq!(containers(&pod), ["migrate", "app", "proxy"]);
        assert!(containers(&serde_json::json!({})).is_empty());
    }
}
