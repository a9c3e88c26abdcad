//! Consistent reads from the cache: an answer at least as new as the cluster at the moment of
//! the read, as a fresh list would be, for a reader that must not miss a write that has just
//! landed (a deployment's snapshot at its success hook: the job's apply has finished, its watch
//! event may still be on the way).
//!
//! Kubernetes' own answer (KEP-2340, consistent reads from the apiserver's cache) asks etcd for
//! the current revision and waits until the cache has seen it, etcd's progress notifications
//! moving an idle resource's cache forward. A client's watch has no such notification on
//! demand: a kind nobody writes gets a BOOKMARK about once a minute, so its watch's version
//! stays behind the cluster's revision although nothing is missing. So the check is per
//! object: for each list the read needs, the server's names and `resourceVersion`s (a
//! metadata-only list, `PartialObjectMetadataList`, of the same selection), compared with the
//! cache's. Caught up is every listed object held at that version or a newer one, and nothing
//! held that the list does not name unless it is newer than the list. A kind still behind after
//! a bounded wait is listed fresh, so the answer is consistent either way.

use std::collections::HashMap;
use std::time::Duration;

use axum::http::HeaderMap;
use serde::Deserialize;

use crate::k8s::discovery::{self, Failure};
use crate::k8s::fetch::{encode, Job};
use crate::k8s::observe::ForAgent;

/// What a metadata list answers: the list's version, and each item's name and version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServerVersions {
    pub list_version: String,
    pub items: HashMap<String, String>,
}

/// `a` is `b` or a later version. A `resourceVersion` is opaque to clients, but every apiserver
/// backed by etcd writes the store's revision, a number that only grows (the apiserver's own
/// cache compares them so); anything else is compared for equality only.
fn same_or_newer(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a >= b,
        _ => a == b,
    }
}

fn newer(a: &str, b: &str) -> bool {
    matches!((a.parse::<u64>(), b.parse::<u64>()), (Ok(a), Ok(b)) if a > b)
}

/// Pure: whether `cached` (name → version, the cache's objects of the list's selection) holds
/// at least what the server listed.
pub(crate) fn caught_up(server: &ServerVersions, cached: &HashMap<String, String>) -> bool {
    let listed_held = server.items.iter().all(|(name, version)| {
        cached
            .get(name)
            .is_some_and(|held| same_or_newer(held, version))
    });
    // Held but not listed: deleted on the server (the cache has not heard yet), unless it was
    // created after the list.
    let nothing_stale = cached
        .iter()
        .filter(|(name, _)| !server.items.contains_key(*name))
        .all(|(_, held)| newer(held, &server.list_version));
    listed_held && nothing_stale
}

/// The name and `resourceVersion` of a held object, read from its text when a consistent read
/// asks (the cache keeps no version per object for this rare question).
pub(crate) fn held_version(text: &str) -> Option<(String, String)> {
    let item: MetaItem = serde_json::from_str(text).ok()?;
    Some((item.metadata.name, item.metadata.resource_version))
}

#[derive(Deserialize)]
struct MetaList {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<MetaItem>,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

#[derive(Deserialize)]
struct MetaItem {
    #[serde(default)]
    metadata: ItemMeta,
}

#[derive(Deserialize, Default)]
struct ItemMeta {
    #[serde(default)]
    name: String,
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
}

/// Metadata only where the apiserver offers it (every one since 1.15), else the objects.
const METADATA: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";

/// The server's names and versions of `job`'s selection now, page by page.
pub(crate) async fn server_versions(
    client: &kube::Client,
    headers: &HeaderMap,
    job: &Job,
    page_size: usize,
    agent: Option<i64>,
    timeout: Duration,
) -> Result<ServerVersions, Failure> {
    let mut out = ServerVersions::default();
    let mut token: Option<String> = None;
    loop {
        let mut query = vec![format!("limit={page_size}")];
        if let Some(selector) = &job.label_selector {
            query.push(format!("labelSelector={}", encode(selector)));
        }
        if let Some(t) = &token {
            query.push(format!("continue={}", encode(t)));
        }
        let uri = format!("{}?{}", job.path, query.join("&"));
        let body = discovery::get_as(
            client,
            &uri,
            headers,
            agent.map(ForAgent),
            timeout,
            METADATA,
        )
        .await?;
        let page: MetaList = serde_json::from_slice(&body).map_err(Failure::bad_body)?;
        if out.list_version.is_empty() {
            out.list_version = page.metadata.resource_version;
        }
        out.items.extend(
            page.items
                .into_iter()
                .map(|i| (i.metadata.name, i.metadata.resource_version)),
        );
        match page.metadata.continue_token.filter(|t| !t.is_empty()) {
            Some(next) => token = Some(next),
            None => return Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(list: &str, items: &[(&str, &str)]) -> ServerVersions {
        ServerVersions {
            list_version: list.into(),
            items: items
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn held(items: &[(&str, &str)]) -> HashMap<String, String> {
        items
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_same_versions_are_caught_up() {
        let s = server("40", &[("web", "31"), ("db", "12")]);
        assert!(caught_up(&s, &held(&[("web", "31"), ("db", "12")])));
        assert!(caught_up(&server("40", &[]), &held(&[])));
    }

    #[test]
    fn a_write_the_cache_has_not_heard_of_is_behind() {
        let s = server("41", &[("web", "41"), ("db", "12")]);
        assert!(!caught_up(&s, &held(&[("web", "31"), ("db", "12")])));
        // Created on the server, not yet in the cache.
        let s = server("42", &[("web", "31"), ("new", "42")]);
        assert!(!caught_up(&s, &held(&[("web", "31")])));
        // Deleted on the server, still in the cache.
        let s = server("43", &[("web", "31")]);
        assert!(!caught_up(&s, &held(&[("web", "31"), ("gone", "20")])));
    }

    #[test]
    fn a_cache_ahead_of_the_list_is_caught_up() {
        // Modified, and created, after the list was answered.
        let s = server("40", &[("web", "31")]);
        assert!(caught_up(&s, &held(&[("web", "45"), ("later", "46")])));
    }

    #[test]
    fn versions_that_are_not_numbers_must_be_equal() {
        assert!(caught_up(
            &server("x", &[("a", "v1")]),
            &held(&[("a", "v1")])
        ));
        assert!(!caught_up(
            &server("x", &[("a", "v1")]),
            &held(&[("a", "v2")])
        ));
        assert!(!caught_up(&server("x", &[]), &held(&[("a", "v2")])));
    }
}
