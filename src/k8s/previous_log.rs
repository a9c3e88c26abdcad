//! The last lines a crashed container printed (SPEC 17): `GET …/pods/<pod>/log?previous=true`
//! as the viewer, bounded, and kept a while per viewer.
//!
//! A crash loop's cause shows what the container's previous run printed before it died. The
//! log is read as the proxy would read it for the same person (SPEC 5.3): through the agent's
//! connection with the viewer's impersonation headers, so the cluster's RBAC decides whether
//! they may read `pods/log`, and a refusal is no lines, not an error. An answer is kept
//! [`KEPT`] per agent, identity, Pod and container: a page viewed again, or by the same
//! person's other tabs, asks the cluster once; two people never share one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Request};

use super::observe::ForAgent;

/// How many lines of the previous run are shown.
pub const LINES: usize = 20;
/// How long an answer (lines or a refusal) is kept.
pub const KEPT: Duration = Duration::from_secs(30);
/// The most bytes asked of the kubelet (`limitBytes`): twenty long lines.
const LIMIT_BYTES: usize = 64 * 1024;
/// A line longer than this is cut.
const LINE_CHARS: usize = 2_000;
/// Past this many answers kept, the oldest half goes.
const MAX_KEPT: usize = 1_000;

/// Whose log of which container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    agent: i64,
    /// The impersonation headers' values, in order; empty for the agent's own identity.
    identity: String,
    namespace: String,
    pod: String,
    container: String,
}

/// When an answer was read, and its lines (`None`: a refusal, no previous run, no answer).
type Kept = HashMap<Key, (Instant, Option<Arc<[String]>>)>;

/// The previous runs' logs read lately, by viewer.
#[derive(Default)]
pub struct PreviousLogs {
    kept: Mutex<Kept>,
}

/// Which container's previous log, read how.
pub struct LogTarget<'a> {
    pub client: &'a kube::Client,
    pub agent: i64,
    /// The viewer's impersonation headers (none when the agent reads as itself), and the
    /// request id's.
    pub headers: &'a HeaderMap,
    pub namespace: &'a str,
    pub pod: &'a str,
    pub container: &'a str,
    pub timeout: Duration,
}

impl PreviousLogs {
    /// The last [`LINES`] lines of the container's previous run, or `None` when the viewer may
    /// not read them, there was no previous run, or the cluster did not answer in time.
    pub async fn read(&self, target: LogTarget<'_>) -> Option<Arc<[String]>> {
        if ![target.namespace, target.pod, target.container]
            .iter()
            .all(|name| is_name(name))
        {
            return None;
        }
        let key = Key {
            agent: target.agent,
            identity: identity(target.headers),
            namespace: target.namespace.to_owned(),
            pod: target.pod.to_owned(),
            container: target.container.to_owned(),
        };
        if let Some((at, lines)) = self.lock().get(&key) {
            if at.elapsed() < KEPT {
                return lines.clone();
            }
        }
        let lines = fetch(&target).await;
        let mut kept = self.lock();
        if kept.len() >= MAX_KEPT {
            kept.retain(|_, (at, _)| at.elapsed() < KEPT);
        }
        if kept.len() < MAX_KEPT {
            kept.insert(key, (Instant::now(), lines.clone()));
        }
        lines
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn fetch(target: &LogTarget<'_>) -> Option<Arc<[String]>> {
    let uri = format!(
        "/api/v1/namespaces/{}/pods/{}/log?container={}&previous=true&tailLines={LINES}&limitBytes={LIMIT_BYTES}",
        target.namespace, target.pod, target.container
    );
    let mut request = Request::get(uri).body(Vec::new()).ok()?;
    for (name, value) in target.headers {
        request.headers_mut().append(name, value.clone());
    }
    request.extensions_mut().insert(ForAgent(target.agent));
    let text = tokio::time::timeout(target.timeout, target.client.request_text(request))
        .await
        .ok()?
        .ok()?;
    Some(last_lines(&text))
}

/// The last [`LINES`] lines of `text`, each cut to [`LINE_CHARS`].
fn last_lines(text: &str) -> Arc<[String]> {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LINES)..]
        .iter()
        .map(|line| match line.char_indices().nth(LINE_CHARS) {
            Some((cut, _)) => format!("{}…", &line[..cut]),
            None => (*line).to_owned(),
        })
        .collect()
}

/// Who reads: the impersonation headers' values, in their order.
fn identity(headers: &HeaderMap) -> String {
    let mut identity = String::new();
    for (name, value) in headers {
        if name.as_str().starts_with("impersonate-") {
            identity.push_str(name.as_str());
            identity.push('=');
            identity.push_str(&String::from_utf8_lossy(value.as_bytes()));
            identity.push('\n');
        }
    }
    identity
}

/// A name Kubernetes gives a namespace, a Pod or a container (DNS subdomains and labels), so
/// that it goes into the path and the query as is.
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_lines_each_bounded() {
        let text: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        let lines = last_lines(&text);
        assert_eq!(lines.len(), LINES);
        assert_eq!(lines[0], "line 11");
        assert_eq!(lines[19], "line 30");
        let long = "x".repeat(LINE_CHARS + 5);
        assert_eq!(last_lines(&long)[0].chars().count(), LINE_CHARS + 1);
        assert!(last_lines("").is_empty());
    }

    #[test]
    fn names_go_into_the_path_only_when_they_are_kubernetes_names() {
        assert!(is_name("api-7f9c4-x2kq"));
        assert!(is_name("shop.prod"));
        assert!(!is_name(""));
        assert!(!is_name("a/b"));
        assert!(!is_name("a?b"));
        assert!(!is_name("Web"));
    }

    #[test]
    fn identities_differ_by_impersonation_only() {
        let mut dev = HeaderMap::new();
        dev.insert("impersonate-user", "gitlab:user:dev".parse().unwrap());
        dev.insert("x-request-id", "1".parse().unwrap());
        let mut other = dev.clone();
        other.insert("x-request-id", "2".parse().unwrap());
        assert_eq!(identity(&dev), identity(&other));
        let mut rep = HeaderMap::new();
        rep.insert("impersonate-user", "gitlab:user:rep".parse().unwrap());
        assert_ne!(identity(&dev), identity(&rep));
        assert_eq!(identity(&HeaderMap::new()), "");
    }
}
