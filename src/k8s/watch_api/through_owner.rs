//! A watch of a socket on a replica that does not own the connection (SPEC 16), answered by
//! the owner's watch cache: the replica the socket reached asks the owner
//! (`replicas::forward::WATCH_PATH`) with the socket's token as the viewer's credential, and
//! the owner, who checks the token and the viewer's `user_access` itself, sends the watch's
//! messages as for a fresh watcher, with [`SYNCED`] after its first complete sync.
//!
//! The socket keeps what its watcher was sent ([`Sent`]). The owner's first sync is gathered
//! whole and compared with it, so that when the stream moves to another owner (a handover,
//! a failover) or to this replica, the watcher is sent only what changed meanwhile: nothing
//! again, nothing lost. An owner that cannot be asked at the start leaves the watch to the
//! cluster, as before replicas; once followed, it is asked again every [`LOOK_AGAIN`].

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::protocol::{self, Params, Selection, Sent};
use super::stream::{name, Ended, Watcher};
use crate::auth::Credential;
use crate::db::replicas::Member;
use crate::error::Error;
use crate::k8s::clusters::Cluster;
use crate::k8s::discovery::ApiKind;
use crate::replicas::forward::{Forward, Lines, NotForwarded, WATCH_PATH};
use crate::resources::object::Object;

/// Said by the owner after the first complete sync of a watch it serves another replica.
pub const SYNCED: &str = r#"{"type":"synced"}"#;
/// How soon the owner is asked again once its stream ended.
const LOOK_AGAIN: Duration = Duration::from_millis(500);

/// Looks for an owner (or this replica's hold) before a watch nobody serves yet goes to the
/// cluster: 4 s, two of the coordination's steps at its default window (10 s).
const UNOWNED_LOOKS: u32 = 8;

/// A socket's way to the owners of its connection.
#[derive(Clone)]
pub struct Through {
    pub forward: Forward,
    /// The socket's token ([`Credential::of_watch_socket`]).
    pub credential: Credential,
    pub agent: i64,
}

impl Through {
    /// The live replica that owns `cluster`'s connection when it is another one.
    pub fn owner(&self, cluster: &Cluster) -> Option<Member> {
        self.forward.owner_of(&cluster.source)
    }
}

/// What a replica asks the owner: one watch of the socket.
#[derive(Debug, Serialize, Deserialize)]
pub struct WatchAsk {
    pub agent: i64,
    pub params: Params,
}

/// How following one owner ended.
enum Followed {
    SocketGone,
    /// The owner refused the watch before any sync (the viewer's RBAC, the agent's rules):
    /// said to the watcher, and the end of the watch.
    Refused,
    /// The owner ended the stream (handed over, gone): look again.
    Ended,
}

/// A message of the owner's.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(default, borrow, rename = "watchEvent")]
    event: Option<Event<'a>>,
    #[serde(default)]
    error: Option<Failure>,
}

/// An error message's Status: said again to the watcher with its own watch id.
#[derive(Deserialize)]
struct Failure {
    object: Status,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    code: Option<u16>,
    #[serde(default)]
    message: String,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(borrow)]
    object: &'a RawValue,
}

impl Watcher {
    /// The watch `id` through the owners of the connection, for as long as the socket lives.
    pub(super) async fn through_owner(
        &self,
        id: &str,
        params: &Params,
        kind: &ApiKind,
        selection: &Selection,
    ) {
        let Some(through) = &self.through else {
            return self.at_cluster(id, params).await;
        };
        let mut sent = Sent::default();
        // Whether the watcher was served yet (here or by an owner): until then, an owner
        // that cannot be asked leaves the watch to the cluster.
        let mut followed = false;
        let mut unowned_looks = 0;
        loop {
            if self.cluster.watch.enabled() {
                // This replica holds the connection: on from what the watcher has, until it
                // no longer does (or the cache stops the namespace).
                followed = true;
                let ended = self
                    .cached(id, &params.namespace, kind, selection, &mut sent)
                    .await;
                if !matches!(ended, Ended::Closed) {
                    return;
                }
            } else if let Some(owner) = through.owner(&self.cluster) {
                let ask = WatchAsk {
                    agent: through.agent,
                    params: params.clone(),
                };
                let opened = through
                    .forward
                    .lines(&owner, WATCH_PATH, &through.credential, &ask)
                    .await;
                match opened {
                    Ok(lines) => {
                        followed = true;
                        match self.follow(id, kind, selection, lines, &mut sent).await {
                            Followed::SocketGone | Followed::Refused => return,
                            Followed::Ended => {}
                        }
                    }
                    // An owner refusing the socket's token before it served the watch (the
                    // replicas do not share the internal secret): the cluster, as when it
                    // cannot be asked. Once it served it, the refusal ends the watch: it would
                    // refuse it again at every look.
                    Err(NotForwarded::Decided(Error::Unauthorized(why))) if !followed => {
                        tracing::warn!(owner = %owner.advertise_url, reason = %why,
                            "watch API: the owner of the agent's connection refused the socket's token");
                        return self.at_cluster(id, params).await;
                    }
                    Err(NotForwarded::Decided(e)) => {
                        let code = e.status().as_u16();
                        return self.fail(id, Some(code), &e.to_string()).await;
                    }
                    Err(NotForwarded::Unreachable(why)) => {
                        tracing::warn!(owner = %owner.advertise_url, reason = %why,
                            "watch API: the owner of the agent's connection did not answer");
                        if !followed {
                            return self.at_cluster(id, params).await;
                        }
                    }
                }
            } else if !followed {
                // Held here with the cache off: the cluster, at once. Not held, and nobody to
                // ask yet: this replica may be about to take the connection, or not have read
                // the live replicas yet. The cluster is asked only after a few looks, so that
                // a socket does not hold a watch of its own at the cluster for as long as it
                // lives when an owner's cache was a moment away.
                if self.cluster.watch.held() || unowned_looks >= UNOWNED_LOOKS {
                    return self.at_cluster(id, params).await;
                }
                unowned_looks += 1;
            }
            // Handed over, the owner gone, or this replica about to take the connection.
            if self.outbox.is_closed() {
                return;
            }
            tokio::time::sleep(LOOK_AGAIN).await;
        }
    }

    /// Follows one owner's stream: its first sync gathered and compared with what the
    /// watcher has, then each event as it comes.
    async fn follow(
        &self,
        id: &str,
        kind: &ApiKind,
        selection: &Selection,
        mut lines: Lines,
        sent: &mut Sent,
    ) -> Followed {
        // The first sync's objects, until the owner says it is complete.
        let mut first: Option<Vec<Arc<Object>>> = Some(Vec::new());
        let mut refused = false;
        // An owner ends a watch it refused mid-way with the error as its last line.
        let mut last_was_error = false;
        while let Some(line) = lines.next().await {
            let Ok(message) = serde_json::from_slice::<Message>(&line) else {
                return Followed::Ended;
            };
            last_was_error = message.kind == "error";
            let events = match (message.kind, message.event) {
                ("synced", _) => match first.take() {
                    Some(now) => sent.sync(now),
                    None => Vec::new(),
                },
                ("data", Some(event)) => {
                    let Ok(object) = Object::parse(event.object, &kind.api_version(), &kind.kind)
                    else {
                        return Followed::Ended;
                    };
                    let name = name(&object);
                    let picked = (event.kind != "DELETED" && selection.picks(&object))
                        .then(|| Arc::new(object));
                    match &mut first {
                        Some(gathered) => {
                            gathered.retain(|o| super::stream::name(o) != name);
                            gathered.extend(picked);
                            Vec::new()
                        }
                        None => sent.apply(&name, picked),
                    }
                }
                ("error", _) => {
                    refused |= first.is_some();
                    let (code, said) = message
                        .error
                        .map_or((None, String::new()), |e| (e.object.code, e.object.message));
                    if !self.send(protocol::error(Some(id), code, &said)).await {
                        return Followed::SocketGone;
                    }
                    Vec::new()
                }
                _ => return Followed::Ended,
            };
            for (event, object) in events {
                if !self.send(protocol::data(id, event, &object, kind)).await {
                    return Followed::SocketGone;
                }
            }
        }
        if (refused && first.is_some()) || last_was_error {
            Followed::Refused
        } else {
            Followed::Ended
        }
    }

    /// Serves another replica's watch from this replica's cache, until the cache stops the
    /// namespace (handed over) or that replica goes away.
    pub async fn for_another_replica(self, params: Params, kind: ApiKind, selection: Selection) {
        let mut sent = Sent::default();
        self.cached(
            OWNER_WATCH_ID,
            &params.namespace,
            &kind,
            &selection,
            &mut sent,
        )
        .await;
    }
}

/// The watch id of the messages the owner sends another replica, who puts its own in their
/// place.
pub const OWNER_WATCH_ID: &str = "";
