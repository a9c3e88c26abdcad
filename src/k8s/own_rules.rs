//! What envlens may list with a connection's own identity (SPEC 13), asked of the cluster.
//!
//! RBAC has no deny, so the chart's role names what envlens may read, and leaves out Secrets
//! but where `rbac.secrets.namespaces` grants them. A view would otherwise send the lists that
//! role refuses and report a 403 for each. Instead envlens asks the cluster once per namespace
//! and period (a `SelfSubjectRulesReview`, authorization.k8s.io/v1) which kinds it may list
//! there, lists only those, and names the others once in the group's `warnings`: no refused
//! list is sent (the chart's replay test holds it).
//!
//! Applied to every read under a connection's own identity, not only to `in_cluster` ones:
//! the watch cache's lists and watches run as the connection's identity whoever views, and a
//! kubeconfig context's identity is as narrow as its operator made it; one rule for every
//! connection keeps a single code path, and a kind the identity may not list tells a viewer
//! nothing more as a 403 than as the warning.
//!
//! Except for an `in_cluster` connection (whose chart's replay test allows no refused request),
//! a cold namespace's first lists need not wait for the review: the watch cache sends them
//! beside it ([`OwnRules::lists_first`]) and then keeps, and shows, only the kinds the rules
//! allow; a list the identity was refused is dropped unseen, as a plain client's 403 would be.
//! Its watches still wait for the review. Through GitLab's agent server the review is a round
//! trip that every first view would otherwise wait for before its first list.
//!
//! A cluster that does not serve the review (404), refuses it (403) or gives no answer in time
//! keeps the old behaviour: every kind is listed and a refusal reported per kind. So do the
//! kinds the rules do not allow when they are `incomplete` (an authorizer that cannot list its
//! rules, such as a webhook, may still allow them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, Request};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::OnceCell;

use crate::k8s::discovery::{ApiKind, Discovered};

/// One rule of a review's `status.resourceRules`, as Kubernetes words it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceRule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
}

/// A review's `status`: what the identity may do in the namespace.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Rules {
    pub resource_rules: Vec<ResourceRule>,
    /// Some authorizer could not tell its rules: what is not listed may still be allowed.
    pub incomplete: bool,
}

impl Rules {
    /// Whether a rule allows `verb` of every object of `group`/`plural`, as RBAC matches it.
    /// A rule limited to `resourceNames` does not: a list or a watch is of every name.
    pub fn allows(&self, verb: &str, group: &str, plural: &str) -> bool {
        let has = |values: &[String], wanted: &str| values.iter().any(|v| v == "*" || v == wanted);
        self.resource_rules.iter().any(|rule| {
            rule.resource_names.is_empty()
                && has(&rule.verbs, verb)
                && has(&rule.api_groups, group)
                && has(&rule.resources, plural)
        })
    }

    /// Whether envlens sends `verb` of `kind`: allowed, or not known to be refused.
    pub fn may(&self, verb: &str, kind: &ApiKind) -> bool {
        self.incomplete || self.allows(verb, &kind.group, &kind.plural)
    }
}

/// Whether `kind` may be listed under `rules` (`None`: not known, so tried).
pub fn may_list(rules: Option<&Rules>, kind: &ApiKind) -> bool {
    rules.is_none_or(|r| r.may("list", kind))
}

/// Whether `kind` may be listed and watched under `rules`: what the watch cache keeps.
pub fn may_watch(rules: Option<&Rules>, kind: &ApiKind) -> bool {
    rules.is_none_or(|r| r.may("list", kind) && r.may("watch", kind))
}

/// Whether a request with `headers` is made as the connection's own identity (no
/// impersonation): the reads that [`OwnView`] narrows.
pub fn is_own_identity(headers: &HeaderMap) -> bool {
    !headers.contains_key("impersonate-user")
}

/// What a view under the connection's own identity lists in a namespace.
#[derive(Debug, Clone)]
pub struct OwnView {
    /// The discovery, without the kinds the identity may not list.
    pub discovered: Discovered,
    /// Whether the namespace's Events may be listed.
    pub events: bool,
    /// Names the kinds left out, once: `envlens may not list secrets in namespace shop: not shown`.
    pub warning: Option<String>,
}

impl OwnView {
    /// Everything discovered, the Events included: a view as an impersonated user (whose own
    /// rights decide), or without rules to go by.
    pub fn all(discovered: Discovered) -> Self {
        OwnView {
            discovered,
            events: true,
            warning: None,
        }
    }

    /// `discovered` narrowed to what `rules` let the identity list in `namespace`.
    pub fn new(rules: Option<&Rules>, discovered: Discovered, namespace: &str) -> Self {
        let Some(rules) = rules else {
            return OwnView::all(discovered);
        };
        let (kept, refused): (Vec<&ApiKind>, Vec<&ApiKind>) = discovered
            .kinds
            .iter()
            .partition(|k| may_list(Some(rules), k));
        let events = may_list(Some(rules), &crate::k8s::discovery::events_kind());
        let mut names: Vec<String> = refused.iter().map(|k| resource_name(k)).collect();
        if !events {
            names.push("events".into());
        }
        names.sort();
        names.dedup();
        let warning = (!names.is_empty()).then(|| {
            format!(
                "envlens may not list {} in namespace {namespace}: not shown",
                names.join(", ")
            )
        });
        if !refused.is_empty() {
            let kept: Vec<ApiKind> = kept.into_iter().cloned().collect();
            return OwnView {
                discovered: Discovered {
                    kinds: kept.into(),
                    ..discovered
                },
                events,
                warning,
            };
        }
        OwnView {
            discovered,
            events,
            warning,
        }
    }
}

/// `pods`, `deployments.apps`: as `kubectl` and the API server's messages name resources.
pub(crate) fn resource_name(kind: &ApiKind) -> String {
    if kind.group.is_empty() {
        kind.plural.clone()
    } else {
        format!("{}.{}", kind.plural, kind.group)
    }
}

/// Namespaces whose rules are kept at most; past it the expired ones go, then all.
const NAMESPACES_KEPT: usize = 4096;

/// One namespace's review, asked once however many views wait: when it was asked, its rules
/// (`None`: none to go by), and whether the answer is kept for the period.
type Flight = OnceCell<(Instant, Option<Arc<Rules>>, bool)>;

/// The connection's own rules per namespace, asked once per namespace and period. Cheap to
/// clone; clones share the cache.
#[derive(Clone)]
pub struct OwnRules {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    ttl: Duration,
    /// Whether a namespace's first lists may go before its review answers.
    lists_first: bool,
    flights: Mutex<HashMap<String, Arc<Flight>>>,
}

impl std::fmt::Debug for OwnRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnRules")
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

impl OwnRules {
    /// `lists_first`: whether a namespace's first lists may be sent before its review answers
    /// (see the module's doc); `false` for an `in_cluster` connection.
    pub fn new(client: kube::Client, ttl: Duration, lists_first: bool) -> Self {
        OwnRules {
            inner: Arc::new(Inner {
                client,
                ttl,
                lists_first,
                flights: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Whether a view should send `namespace`'s lists beside its review instead of after it:
    /// allowed for this connection, and the review not answered yet (once it is, the rules
    /// are known at once and no refused list need be sent).
    pub fn lists_first(&self, namespace: &str) -> bool {
        if !self.inner.lists_first {
            return false;
        }
        let flights = self.inner.flights.lock().unwrap_or_else(|e| e.into_inner());
        match flights.get(namespace).and_then(|f| f.get()) {
            Some((at, _, keep)) => !(*keep && at.elapsed() < self.inner.ttl),
            None => true,
        }
    }

    /// The identity's rules in `namespace`: reused for the period, awaited from the view
    /// already asking, or asked now (at most `timeout`). `None` when the cluster gives none.
    pub async fn get(&self, namespace: &str, timeout: Duration) -> Option<Arc<Rules>> {
        let usable = |flight: &Flight| match flight.get() {
            None => true,
            Some((at, _, keep)) => *keep && at.elapsed() < self.inner.ttl,
        };
        let flight = {
            let mut flights = self.inner.flights.lock().unwrap_or_else(|e| e.into_inner());
            match flights.get(namespace) {
                Some(flight) if usable(flight) => flight.clone(),
                _ => {
                    if flights.len() >= NAMESPACES_KEPT {
                        flights.retain(|_, f| usable(f));
                        if flights.len() >= NAMESPACES_KEPT {
                            flights.clear();
                        }
                    }
                    let flight = Arc::new(Flight::new());
                    flights.insert(namespace.to_owned(), flight.clone());
                    flight
                }
            }
        };
        let (_, rules, _) = flight
            .get_or_init(|| async {
                let asked = tokio::time::timeout(timeout, review(&self.inner.client, namespace));
                let (rules, keep) = match asked.await {
                    Ok(Asked::Rules(rules)) => (Some(Arc::new(rules)), true),
                    Ok(Asked::NotServed) => (None, true),
                    Ok(Asked::Failed(why)) => {
                        tracing::debug!(namespace, %why, "SelfSubjectRulesReview failed: every kind is tried");
                        (None, false)
                    }
                    Err(_) => (None, false),
                };
                (Instant::now(), rules, keep)
            })
            .await;
        rules.clone()
    }
}

/// What one review came to.
enum Asked {
    Rules(Rules),
    /// 404 or 403: the cluster does not serve the review, or not to this identity. Asking
    /// again within the period changes nothing.
    NotServed,
    /// No answer, or one that cannot be read: the next view asks again.
    Failed(String),
}

/// One `SelfSubjectRulesReview` of `namespace`, as the connection's own identity.
async fn review(client: &kube::Client, namespace: &str) -> Asked {
    let body = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    });
    let request = match Request::post("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(kube::client::Body::from(body.to_string().into_bytes()))
    {
        Ok(request) => request,
        Err(e) => return Asked::Failed(e.to_string()),
    };
    match crate::k8s::exchange(client, request).await {
        Err(e) => Asked::Failed(e.to_string()),
        Ok((status, _)) if matches!(status.as_u16(), 403 | 404) => Asked::NotServed,
        Ok((status, bytes)) if status.is_success() => {
            #[derive(Deserialize)]
            struct Review {
                status: Rules,
            }
            match serde_json::from_slice::<Review>(&bytes) {
                Ok(review) => Asked::Rules(review.status),
                Err(e) => Asked::Failed(format!("the review's answer cannot be read: {e}")),
            }
        }
        Ok((status, bytes)) => Asked::Failed(crate::k8s::discovery::error_message(status, &bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(group: &str, plural: &str) -> ApiKind {
        ApiKind {
            group: group.into(),
            version: "v1".into(),
            kind: plural.into(),
            plural: plural.into(),
            namespaced: true,
            watchable: true,
        }
    }

    fn rules(value: serde_json::Value) -> Rules {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn rules_match_as_rbac_does() {
        let r = rules(json!({"resourceRules": [
            {"verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["pods", "configmaps"]},
            {"verbs": ["list"], "apiGroups": ["apps"], "resources": ["*"]},
            {"verbs": ["*"], "apiGroups": ["*"], "resources": ["widgets"]},
            {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["one"]},
        ], "nonResourceRules": [], "incomplete": false}));
        assert!(r.allows("list", "", "pods") && r.allows("watch", "", "configmaps"));
        assert!(
            r.allows("list", "apps", "deployments") && !r.allows("watch", "apps", "deployments")
        );
        assert!(r.allows("watch", "example.com", "widgets"));
        // Named objects only: no list.
        assert!(!r.allows("list", "", "secrets"));
        assert!(!r.allows("list", "", "services") && !r.allows("list", "batch", "pods"));
        assert!(may_watch(Some(&r), &kind("", "pods")));
        assert!(may_list(Some(&r), &kind("apps", "deployments")));
        assert!(!may_watch(Some(&r), &kind("apps", "deployments")));
        // Without rules, or with incomplete ones, everything is tried.
        assert!(may_watch(None, &kind("", "secrets")));
        let incomplete = Rules {
            incomplete: true,
            ..r
        };
        assert!(may_watch(Some(&incomplete), &kind("", "secrets")));
    }

    #[tokio::test]
    async fn lists_go_before_the_review_only_where_refused_lists_may_be_sent() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let ttl = Duration::from_secs(60);
        // in_cluster: the chart's replay test allows no refused list.
        assert!(!OwnRules::new(client.clone(), ttl, false).lists_first("shop"));
        let own = OwnRules::new(client, ttl, true);
        assert!(own.lists_first("shop"));
        // A failed review is asked again, so the next view lists first too.
        assert!(own.get("shop", Duration::from_secs(5)).await.is_none());
        assert!(own.lists_first("shop"));
        // Once an answer is kept, the rules are known at once: no list goes before them.
        let kept = Flight::new_with(Some((
            Instant::now(),
            Some(Arc::new(Rules::default())),
            true,
        )));
        lock_flights(&own).insert("shop".into(), Arc::new(kept));
        assert!(!own.lists_first("shop") && own.lists_first("apps"));
    }

    fn lock_flights(own: &OwnRules) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Flight>>> {
        own.inner.flights.lock().unwrap()
    }

    #[test]
    fn a_view_leaves_out_what_it_may_not_list_and_says_so_once() {
        let discovered = Discovered {
            kinds: vec![
                kind("", "pods"),
                kind("", "secrets"),
                kind("example.com", "widgets"),
            ]
            .into(),
            failures: Arc::new([]),
            fetched_at: Instant::now(),
            generation: 3,
        };
        let r = rules(json!({"resourceRules": [
            {"verbs": ["list", "watch"], "apiGroups": [""], "resources": ["pods"]},
        ]}));
        let view = OwnView::new(Some(&r), discovered.clone(), "shop");
        assert_eq!(&*view.discovered.kinds, &[kind("", "pods")]);
        assert_eq!(view.discovered.generation, 3);
        assert!(!view.events);
        assert_eq!(
            view.warning.as_deref(),
            Some("envlens may not list events, secrets, widgets.example.com in namespace shop: not shown")
        );
        let all = OwnView::new(None, discovered.clone(), "shop");
        assert_eq!(all.discovered.kinds.len(), 3);
        assert!(all.events && all.warning.is_none());
        let everything = rules(json!({"resourceRules": [
            {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
        ]}));
        let view = OwnView::new(Some(&everything), discovered, "shop");
        assert!(Arc::ptr_eq(&view.discovered.kinds, &all.discovered.kinds));
        assert!(view.events && view.warning.is_none());
    }
}
