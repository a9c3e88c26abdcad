//! Who sees what from the shared cache under `access_as: user` (SPEC 8.1): a kind is shown only
//! after the cluster's `SubjectAccessReview` for the impersonated identity allows both `list`
//! and `watch` of it in the namespace. Decisions are reused for `kubernetes.access_cache`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, HeaderValue, Request};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::k8s::discovery::{ApiKind, Failure};

/// The identity a request impersonates, read back from its `Impersonate-*` headers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// `None` without `Impersonate-User`: the agent's own identity, which the cache lists with.
    pub fn from_headers(headers: &HeaderMap) -> Option<Identity> {
        let text = |v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
        let user = headers.get("impersonate-user").map(text)?;
        let groups = headers
            .get_all("impersonate-group")
            .iter()
            .map(text)
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in headers {
            if let Some(key) = name.as_str().strip_prefix("impersonate-extra-") {
                extra
                    .entry(percent_decode(key))
                    .or_default()
                    .push(text(value));
            }
        }
        Some(Identity {
            user,
            groups,
            extra,
        })
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

type Key = (Identity, String, String, String);

/// Recent decisions: `(identity, namespace, group, plural)` → refused with this failure, or not.
pub(crate) struct AccessCache {
    ttl: Duration,
    decisions: Mutex<HashMap<Key, (Instant, Option<Failure>)>>,
}

const REVIEWS_IN_FLIGHT: usize = 16;

impl AccessCache {
    pub fn new(ttl: Duration) -> Self {
        AccessCache {
            ttl,
            decisions: Mutex::new(HashMap::new()),
        }
    }

    /// For each kind, `None` when `who` may list and watch it in `namespace`, else the failure
    /// to report (403 worded as the API server words a refused list).
    pub async fn check(
        &self,
        client: &kube::Client,
        who: &Identity,
        namespace: &str,
        kinds: &[ApiKind],
        headers: &HeaderMap,
        timeout: Duration,
    ) -> Vec<Option<Failure>> {
        // The reviews are the view's own requests: they carry its other headers (`Audit-ID`),
        // not the impersonation, which the review names in its body instead.
        let mut own = HeaderMap::new();
        for (name, value) in headers {
            if !name.as_str().starts_with("impersonate-") {
                own.append(name, value.clone());
            }
        }
        let own = Arc::new(own);
        let mut out: Vec<Option<Option<Failure>>> = vec![None; kinds.len()];
        let key = |k: &ApiKind| {
            (
                who.clone(),
                namespace.to_owned(),
                k.group.clone(),
                k.plural.clone(),
            )
        };
        {
            let mut decisions = self.decisions.lock().unwrap_or_else(|e| e.into_inner());
            decisions.retain(|_, (at, _)| at.elapsed() < self.ttl);
            for (i, kind) in kinds.iter().enumerate() {
                if let Some((_, decision)) = decisions.get(&key(kind)) {
                    out[i] = Some(decision.clone());
                }
            }
        }
        let limit = Arc::new(Semaphore::new(REVIEWS_IN_FLIGHT));
        let mut tasks = JoinSet::new();
        for (i, kind) in kinds.iter().enumerate().filter(|(i, _)| out[*i].is_none()) {
            let (client, who, namespace, kind, limit, own) = (
                client.clone(),
                who.clone(),
                namespace.to_owned(),
                kind.clone(),
                limit.clone(),
                own.clone(),
            );
            tasks.spawn(async move {
                let _permit = limit.acquire().await;
                let mut decision = None;
                for verb in ["list", "watch"] {
                    match review(&client, &who, &namespace, &kind, verb, &own, timeout).await {
                        Ok(true) => {}
                        Ok(false) => {
                            decision = Some(refused(&who, &namespace, &kind, verb));
                            break;
                        }
                        Err(failure) => {
                            decision = Some(failure);
                            break;
                        }
                    }
                }
                (i, decision)
            });
        }
        let now = Instant::now();
        let mut fresh = Vec::new();
        while let Some(Ok((i, decision))) = tasks.join_next().await {
            // A review that got no answer is not a decision: asked again next time.
            if decision.as_ref().is_none_or(|f| f.code == Some(403)) {
                fresh.push((key(&kinds[i]), decision.clone()));
            }
            out[i] = Some(decision);
        }
        let mut decisions = self.decisions.lock().unwrap_or_else(|e| e.into_inner());
        for (k, decision) in fresh {
            decisions.insert(k, (now, decision));
        }
        drop(decisions);
        out.into_iter()
            .map(|d| {
                d.unwrap_or_else(|| {
                    Some(Failure {
                        code: None,
                        message: "the access review did not finish".into(),
                        answered: false,
                    })
                })
            })
            .collect()
    }
}

/// The API server's own words for a refused request.
fn refused(who: &Identity, namespace: &str, kind: &ApiKind, verb: &str) -> Failure {
    let resource = if kind.group.is_empty() {
        kind.plural.clone()
    } else {
        format!("{}.{}", kind.plural, kind.group)
    };
    Failure {
        code: Some(403),
        message: format!(
            "{resource} is forbidden: User \"{}\" cannot {verb} resource \"{}\" in API group \"{}\" in the namespace \"{namespace}\"",
            who.user, kind.plural, kind.group
        ),
        answered: true,
    }
}

/// One `SubjectAccessReview`, sent as the agent's own identity.
async fn review(
    client: &kube::Client,
    who: &Identity,
    namespace: &str,
    kind: &ApiKind,
    verb: &str,
    headers: &HeaderMap,
    timeout: Duration,
) -> Result<bool, Failure> {
    let body = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": who.user,
            "groups": who.groups,
            "extra": who.extra,
            "resourceAttributes": {"namespace": namespace, "verb": verb, "group": kind.group, "resource": kind.plural},
        },
    });
    let no_answer = |message: String| Failure {
        code: None,
        message,
        answered: false,
    };
    let request = Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(kube::client::Body::from(body.to_string().into_bytes()))
        .map_err(|e| no_answer(e.to_string()));
    let mut request = request?;
    for (name, value) in headers {
        request.headers_mut().append(name, value.clone());
    }
    let exchange = async {
        let response = client.send(request).await?;
        let status = response.status();
        let bytes = response.into_body().collect_bytes().await?;
        Ok::<_, kube::Error>((status, bytes))
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Err(no_answer(format!(
            "no answer to the access review within {} s",
            timeout.as_secs_f64()
        ))),
        Ok(Err(e)) => Err(no_answer(e.to_string())),
        Ok(Ok((status, bytes))) if status.is_success() => {
            let review: serde_json::Value =
                serde_json::from_slice(&bytes).map_err(Failure::bad_body)?;
            Ok(review["status"]["allowed"].as_bool() == Some(true))
        }
        Ok(Ok((status, bytes))) => Err(Failure {
            code: Some(status.as_u16()),
            message: crate::k8s::discovery::error_message(status, &bytes),
            answered: true,
        }),
    }
}
