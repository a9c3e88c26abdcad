//! Who sees what from the shared cache under `access_as: user` (SPEC 8.1): a kind is shown only
//! after the cluster's `SubjectAccessReview` for the impersonated identity allows both `list`
//! and `watch` of it in the namespace. Decisions are reused for `kubernetes.access_cache`, and
//! each is asked once however many views want it at the same time ([`AccessCache`]).

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

/// One question to the cluster: may `who` `verb` the kind `group`/`plural` in `namespace`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Question {
    who: Identity,
    namespace: String,
    group: String,
    plural: String,
    verb: &'static str,
}

/// The cluster's answer to one [`Question`]: allowed or not, or why there is none.
type Answer = Result<bool, Failure>;

/// One review, asked once however many views wait for it; its answer, dated when it was asked.
type Flight = tokio::sync::OnceCell<(Instant, Answer)>;

/// Whether an answer is a decision, to reuse for the cache's period: the review's own answer,
/// or a 403 to the review itself (the agent may not ask; asking again changes nothing). Any
/// other failure (no answer, a 5xx) is given to the views waiting for that review and no one
/// else: the next view asks again.
fn decided(answer: &Answer) -> bool {
    match answer {
        Ok(_) => true,
        Err(failure) => failure.code == Some(403),
    }
}

/// The reviews asked and being asked, per [`Question`]: single flight and reuse in one map.
///
/// A view that finds no usable entry puts a new [`Flight`] in and asks; views that come while it
/// is in flight wait for the same answer (one request to the cluster however many views miss
/// together, as a hundred viewers opening one environment do). If the view asking goes away
/// (its request cancelled), a waiting one takes over the review. A decision is reused for
/// `kubernetes.access_cache` from when the view that asked it began its check; a failure ends
/// with its flight.
///
/// Per kind, `list` is asked first and `watch` only once `list` is allowed: a refused kind
/// costs one review, an allowed one two, and no more per identity, namespace and period.
pub(crate) struct AccessCache {
    ttl: Duration,
    flights: Mutex<HashMap<Question, Arc<Flight>>>,
    /// Each identity's decisions of a namespace's kinds as a warm view last read them, until
    /// the first of them expires ([`Kept`]).
    kept: Mutex<HashMap<Identity, HashMap<String, Kept>>>,
    /// When expired entries were last forgotten ([`SWEEP_EVERY`]).
    swept: Mutex<Instant>,
    /// Reviews being sent at once by this cache, across views and identities: a burst of new
    /// identities reaches the cluster at this pace.
    limit: Arc<Semaphore>,
}

const REVIEWS_IN_FLIGHT: usize = 16;

/// Expired decisions are forgotten at most this often, not on every view: they are never
/// used once expired anyway ([`AccessCache::usable`]); forgetting them only bounds the map.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The decisions of one identity for one namespace's kinds, as [`AccessCache::all_decided`]
/// read them, kept until the oldest of them expires. A warm view of a namespace (a GitOps
/// group checks seven on every view) reads them with one lookup, where reading each kind's
/// two questions again hashed and compared the identity 56 times a namespace. Nothing else
/// changes a decision before it expires: a flight is replaced only once it is not usable.
struct Kept {
    kinds: Vec<ApiKind>,
    until: Instant,
    decisions: Vec<Option<Failure>>,
}

/// The two verbs a cached kind needs, in the order they are asked.
const VERBS: [&str; 2] = ["list", "watch"];

impl AccessCache {
    pub fn new(ttl: Duration) -> Self {
        AccessCache {
            ttl,
            flights: Mutex::new(HashMap::new()),
            kept: Mutex::new(HashMap::new()),
            swept: Mutex::new(Instant::now()),
            limit: Arc::new(Semaphore::new(REVIEWS_IN_FLIGHT)),
        }
    }

    /// For each kind, `None` when `who` may list and watch it in `namespace`, else the failure
    /// to report (403 worded as the API server words a refused list or watch).
    pub async fn check(
        self: &Arc<Self>,
        client: &kube::Client,
        who: &Identity,
        namespace: &str,
        kinds: &[ApiKind],
        headers: &HeaderMap,
        timeout: Duration,
    ) -> Vec<Option<Failure>> {
        // One instant for the whole view: its questions are all fresh or all reused together
        // (a view never pairs a kind refused just now with another allowed from before), and
        // the ones it asks are dated together, so they expire together too.
        let now = Instant::now();
        self.forget_expired(now);
        if let Some(decisions) = self.kept_decisions(who, namespace, kinds, now) {
            return decisions;
        }
        if let Some((decisions, oldest)) = self.all_decided(who, namespace, kinds, now) {
            self.keep(who, namespace, kinds, oldest + self.ttl, &decisions);
            return decisions;
        }
        // The reviews are the view's own requests: they carry its other headers (`Audit-ID`),
        // not the impersonation, which the review names in its body instead. A review shared
        // by several views carries the headers of the view that asked it.
        let mut own = HeaderMap::new();
        for (name, value) in headers {
            if !name.as_str().starts_with("impersonate-") {
                own.append(name, value.clone());
            }
        }
        let own = Arc::new(own);
        let mut out: Vec<Option<Option<Failure>>> = vec![None; kinds.len()];
        let mut tasks = JoinSet::new();
        for (i, kind) in kinds.iter().enumerate() {
            let (this, client, who, namespace, kind, own) = (
                self.clone(),
                client.clone(),
                who.clone(),
                namespace.to_owned(),
                kind.clone(),
                own.clone(),
            );
            tasks.spawn(async move {
                for verb in VERBS {
                    let question = Question {
                        who: who.clone(),
                        namespace: namespace.clone(),
                        group: kind.group.clone(),
                        plural: kind.plural.clone(),
                        verb,
                    };
                    match this.ask(&client, question, &own, timeout, now).await {
                        Ok(true) => {}
                        Ok(false) => return (i, Some(refused(&who, &namespace, &kind, verb))),
                        Err(failure) => return (i, Some(failure)),
                    }
                }
                (i, None)
            });
        }
        while let Some(Ok((i, decision))) = tasks.join_next().await {
            out[i] = Some(decision);
        }
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

    /// The decisions [`keep`](Self::keep) kept for `who`, `namespace` and `kinds`, while none
    /// of them has expired at `now`.
    fn kept_decisions(
        &self,
        who: &Identity,
        namespace: &str,
        kinds: &[ApiKind],
        now: Instant,
    ) -> Option<Vec<Option<Failure>>> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let found = kept
            .get(who)?
            .get(namespace)
            .filter(|k| now < k.until && k.kinds == kinds)?;
        Some(found.decisions.clone())
    }

    /// Keeps `decisions` (all read from usable flights, the oldest expiring at `until`).
    fn keep(
        &self,
        who: &Identity,
        namespace: &str,
        kinds: &[ApiKind],
        until: Instant,
        decisions: &[Option<Failure>],
    ) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let of_who = match kept.get_mut(who) {
            Some(of_who) => of_who,
            None => kept.entry(who.clone()).or_default(),
        };
        of_who.insert(
            namespace.to_owned(),
            Kept {
                kinds: kinds.to_vec(),
                until,
                decisions: decisions.to_vec(),
            },
        );
    }

    /// What [`check`](Self::check) answers when every question of the view has a decision
    /// usable at `now` (a warm view's case): read under one lock, without a task per kind,
    /// with the instant the oldest of them was asked; `None` when any is missing, in flight or
    /// expired.
    fn all_decided(
        &self,
        who: &Identity,
        namespace: &str,
        kinds: &[ApiKind],
        now: Instant,
    ) -> Option<(Vec<Option<Failure>>, Instant)> {
        let mut oldest = now;
        let flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        let mut question = Question {
            who: who.clone(),
            namespace: namespace.to_owned(),
            group: String::new(),
            plural: String::new(),
            verb: VERBS[0],
        };
        let decisions: Option<Vec<Option<Failure>>> = kinds
            .iter()
            .map(|kind| {
                question.group.clone_from(&kind.group);
                question.plural.clone_from(&kind.plural);
                for verb in VERBS {
                    question.verb = verb;
                    let (at, answer) = flights.get(&question)?.get()?;
                    if !decided(answer) || now.saturating_duration_since(*at) >= self.ttl {
                        return None;
                    }
                    oldest = oldest.min(*at);
                    match answer {
                        Ok(true) => {}
                        Ok(false) => return Some(Some(refused(who, namespace, kind, verb))),
                        Err(failure) => return Some(Some(failure.clone())),
                    }
                }
                Some(None)
            })
            .collect();
        decisions.map(|d| (d, oldest))
    }

    /// The answer to `question`: reused, awaited from the view already asking, or asked now
    /// (dated `now`, the asking view's instant).
    async fn ask(
        &self,
        client: &kube::Client,
        question: Question,
        headers: &HeaderMap,
        timeout: Duration,
        now: Instant,
    ) -> Answer {
        let flight = {
            let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            match flights.get(&question) {
                Some(flight) if self.usable(flight, now) => flight.clone(),
                _ => {
                    let flight = Arc::new(Flight::new());
                    flights.insert(question.clone(), flight.clone());
                    flight
                }
            }
        };
        let (_, answer) = flight
            .get_or_init(|| async {
                // The timeout is the review's own, from when it is sent: a burst of questions
                // (a first view of many namespaces at once) waits its turn for a permit
                // without counting that wait against the cluster's answer.
                let _permit = self.limit.acquire().await;
                let asked = review(client, &question, headers);
                let answer = match tokio::time::timeout(timeout, asked).await {
                    Ok(answer) => answer,
                    Err(_) => Err(Failure {
                        code: None,
                        message: format!(
                            "no answer to the access review within {} s",
                            timeout.as_secs_f64()
                        ),
                        answered: false,
                    }),
                };
                (now, answer)
            })
            .await;
        if !decided(answer) {
            // The views of this flight have the failure; the next one asks again.
            let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            if flights
                .get(&question)
                .is_some_and(|f| Arc::ptr_eq(f, &flight))
            {
                flights.remove(&question);
            }
        }
        answer.clone()
    }

    /// In flight, or a decision asked less than the period before `now`.
    fn usable(&self, flight: &Flight, now: Instant) -> bool {
        match flight.get() {
            None => true,
            Some((at, answer)) => decided(answer) && now.saturating_duration_since(*at) < self.ttl,
        }
    }

    /// Forgets the decisions expired at `now`, at most every [`SWEEP_EVERY`].
    fn forget_expired(&self, now: Instant) {
        {
            let mut swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
            if now.saturating_duration_since(*swept) < SWEEP_EVERY {
                return;
            }
            *swept = now;
        }
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        flights.retain(|_, flight| self.usable(flight, now));
        drop(flights);
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|_, of_who| {
            of_who.retain(|_, k| now < k.until);
            !of_who.is_empty()
        });
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
async fn review(client: &kube::Client, question: &Question, headers: &HeaderMap) -> Answer {
    let Question {
        who,
        namespace,
        group,
        plural,
        verb,
    } = question;
    let body = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": who.user,
            "groups": who.groups,
            "extra": who.extra,
            "resourceAttributes": {"namespace": namespace, "verb": verb, "group": group, "resource": plural},
        },
    });
    let no_answer = |message: String| Failure {
        code: None,
        message,
        answered: false,
    };
    let mut request = Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(kube::client::Body::from(body.to_string().into_bytes()))
        .map_err(|e| no_answer(e.to_string()))?;
    for (name, value) in headers {
        request.headers_mut().append(name, value.clone());
    }
    match crate::k8s::exchange(client, request).await {
        Err(e) => Err(no_answer(e.to_string())),
        Ok((status, bytes)) if status.is_success() => {
            let review: serde_json::Value =
                serde_json::from_slice(&bytes).map_err(Failure::bad_body)?;
            Ok(review["status"]["allowed"].as_bool() == Some(true))
        }
        Ok((status, bytes)) => Err(Failure {
            code: Some(status.as_u16()),
            message: crate::k8s::discovery::error_message(status, &bytes),
            answered: true,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(plural: &str) -> ApiKind {
        ApiKind {
            group: "apps".into(),
            version: "v1".into(),
            kind: plural.into(),
            plural: plural.into(),
            namespaced: true,
            watchable: true,
        }
    }

    fn who(user: &str) -> Identity {
        Identity {
            user: user.into(),
            groups: vec!["developers".into()],
            extra: BTreeMap::new(),
        }
    }

    /// `who` may `verb` `kind` in `namespace` (or not), as decided at `at`.
    fn decide(
        cache: &AccessCache,
        who: &Identity,
        kind: &ApiKind,
        verb: &'static str,
        at: Instant,
        allowed: bool,
    ) {
        let question = Question {
            who: who.clone(),
            namespace: "shop".into(),
            group: kind.group.clone(),
            plural: kind.plural.clone(),
            verb,
        };
        let flight = Arc::new(Flight::new_with(Some((at, Ok(allowed)))));
        cache.flights.lock().unwrap().insert(question, flight);
    }

    /// The decisions a warm view reads with one lookup are those of every kind's questions,
    /// and expire with the oldest of them: never used past the configured time.
    #[test]
    fn kept_decisions_expire_with_the_oldest_of_them() {
        let ttl = Duration::from_secs(60);
        let cache = AccessCache::new(ttl);
        let (dev, other) = (who("dev"), who("other"));
        let kinds = [kind("deployments"), kind("secrets")];
        let t0 = Instant::now();
        let older = t0 + Duration::from_secs(1);
        let newer = t0 + Duration::from_secs(5);
        decide(&cache, &dev, &kinds[0], "list", newer, true);
        decide(&cache, &dev, &kinds[0], "watch", older, true);
        decide(&cache, &dev, &kinds[1], "list", newer, false);
        let now = t0 + Duration::from_secs(10);
        let (decisions, oldest) = cache
            .all_decided(&dev, "shop", &kinds, now)
            .expect("decided");
        assert_eq!(oldest, older);
        assert!(decisions[0].is_none());
        assert_eq!(decisions[1].as_ref().and_then(|f| f.code), Some(403));
        cache.keep(&dev, "shop", &kinds, oldest + ttl, &decisions);

        let kept =
            cache.kept_decisions(&dev, "shop", &kinds, older + ttl - Duration::from_millis(1));
        assert_eq!(kept, Some(decisions));
        assert_eq!(
            cache.kept_decisions(&dev, "shop", &kinds, older + ttl),
            None,
            "expired"
        );
        assert_eq!(
            cache.kept_decisions(&other, "shop", &kinds, now),
            None,
            "another identity"
        );
        assert_eq!(
            cache.kept_decisions(&dev, "web", &kinds, now),
            None,
            "another namespace"
        );
        assert_eq!(
            cache.kept_decisions(&dev, "shop", &kinds[..1], now),
            None,
            "other kinds"
        );
        // Past the oldest decision's time, the flights do not answer either: asked again.
        assert!(cache
            .all_decided(&dev, "shop", &kinds, older + ttl)
            .is_none());
    }
}
