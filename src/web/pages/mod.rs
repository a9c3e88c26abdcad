//! The pages, as pure functions from what was read to HTML: the handlers (`web`) read, these
//! render. Every page is complete without script; `dashboard.js` applies a subscription's
//! message in place where it can (a resource's health: `data-uid`) and otherwise re-renders
//! the regions marked `data-live-region` from the server.

pub mod agent;
pub mod causes;
pub mod deployment;
pub mod environment;
pub mod flux_actions;
pub mod groups;
pub mod resource;

use maud::{html, Markup, DOCTYPE};

use super::assets;
use super::order::{health_class, title};

/// What every page's frame shows.
pub struct Chrome<'a> {
    pub title: &'a str,
    pub username: Option<&'a str>,
    /// The session's CSRF token: sign-out and the subscription's `connection_init` carry it.
    pub csrf: Option<&'a str>,
    /// The GraphQL subscription that keeps the page fresh, with its variables.
    pub subscription: Option<(&'static str, serde_json::Value)>,
}

pub const ENVIRONMENTS_UPDATED: &str =
    "subscription($groupPath: ID) { environmentsUpdated(groupPath: $groupPath) { id } }";
/// What the environment page's script applies in place: each changed resource's health, and
/// enough of the rest (removals, edges, events, notes) to tell when to re-render from the server.
pub const RESOURCE_GROUP_UPDATED: &str = "subscription($environmentId: ID!) { resourceGroupUpdated(environmentId: $environmentId) { \
     complete health healthMessage warnings errors { kind } removed edgesAdded { from } edgesRemoved { from } \
     upserted { uid health { status message } events { count } } } }";

/// The frame: header with navigation and the viewer, the live status, then `content`.
pub fn page(chrome: &Chrome, content: Markup) -> Markup {
    let (query, variables) = match &chrome.subscription {
        Some((q, v)) => (Some(*q), Some(v.to_string())),
        None => (None, None),
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(csrf) = chrome.csrf { meta name="csrf-token" content=(csrf); }
                title { (chrome.title) " · envlens" }
                link rel="icon" href=(assets::path("favicon.svg")) type="image/svg+xml";
                link rel="stylesheet" href=(assets::path("dashboard.css"));
                script src=(assets::path("dashboard.js")) defer {}
            }
            body data-subscription=[query] data-variables=[variables] {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    a.brand href="/" {
                        img src=(assets::path("favicon.svg")) alt="" width="22" height="22";
                        "envlens"
                    }
                    nav aria-label="Main" {
                        a href="/" { "Groups" }
                        a href=(crate::graphql::explorer::PATH) { "GraphQL explorer" }
                    }
                    span #live role="status" aria-live="polite" {}
                    @if let Some(user) = chrome.username {
                        div.who {
                            span { "Signed in as " strong { (user) } }
                            @if let Some(csrf) = chrome.csrf {
                                form method="post" action="/-/sign-out" {
                                    input type="hidden" name="csrf" value=(csrf);
                                    button type="submit" { "Sign out" }
                                }
                            }
                        }
                    }
                }
                main #main tabindex="-1" { (content) }
            }
        }
    }
}

/// A health status as a labelled badge: colour and word.
pub fn health_badge(status: Option<&str>) -> Markup {
    html! {
        span class={"badge " (health_class(status))} {
            (status.map_or("No health".to_owned(), title))
        }
    }
}

/// An error page: what went wrong, in words a user can act on.
pub fn error(chrome: &Chrome, status: u16, message: &str) -> Markup {
    page(
        chrome,
        html! {
            h1 { (match status { 404 => "Not found", 400 | 422 => "That request cannot be answered", 401 | 403 => "Not allowed", 503 => "envlens is unavailable", _ => "Something went wrong" }) }
            p.notice.error { (message) }
            p { a href="/" { "Back to your groups" } }
        },
    )
}

/// A URL query string of `pairs`, each value percent-encoded.
pub fn query(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        out.push(if i == 0 { '?' } else { '&' });
        out.push_str(k);
        out.push('=');
        out.push_str(&encode(v));
    }
    out
}

/// Percent-encoding of a query value or path segment (RFC 3986 unreserved kept; `/` kept, as
/// group paths read better with it).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub fn environment_href(project: &str, name: &str) -> String {
    format!(
        "/environments{}",
        query(&[("project", project), ("name", name)])
    )
}

pub fn group_href(path: &str) -> String {
    format!("/groups/{}", encode(path))
}
