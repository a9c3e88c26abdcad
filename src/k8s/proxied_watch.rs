//! A proxied Kubernetes watch (`?watch=true` through `/k8s-proxy`) of a connection another
//! replica holds (SPEC 16): served by that owner, who authenticates the viewer afresh from
//! the credential the request came with, decides their `user_access` itself and watches the
//! cluster as them (`replicas::watches::proxied`). The owner's answer, marked [`ANSWERED`],
//! is relayed as it comes; anything else (the owner gone, not holding the connection any
//! more, not sharing the internal secret) leaves the watch to this replica, as before
//! replicas. A watch the owner ends when it hands the connection over ends here too: a
//! Kubernetes client resumes it from its last `resourceVersion`, through the new owner.

use axum::body::Body;
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use serde::{Deserialize, Serialize};

use super::clusters::Cluster;
use super::proxy::{request_headers, response_headers};
use crate::auth::Credential;
use crate::replicas::forward::{Forward, PROXY_PATH};

/// The header by which the owner says its answer is the proxy's (the cluster's, or the
/// proxy's own refusal), not a refusal of the forwarding; never sent to the client.
pub const ANSWERED: &str = "envlens-replica-proxied";

/// What a replica asks the owner: the watch's path and query (as sent to the cluster) and
/// the client's headers, cleaned as the proxy cleans them.
#[derive(Debug, Serialize, Deserialize)]
pub struct ProxyAsk {
    pub agent: i64,
    pub uri: String,
    pub headers: Vec<(String, String)>,
}

/// The owner's answer to the watch `uri` of `agent` (already admitted here), when another
/// replica owns `cluster`'s connection and answered; `None` when it is served here.
pub async fn through_owner(
    forward: &Forward,
    cluster: &Cluster,
    credential: &Credential,
    agent: i64,
    uri: &Uri,
    headers: &HeaderMap,
) -> Option<Response> {
    let owner = forward.owner_of(&cluster.source)?;
    if credential.is_empty() {
        return None;
    }
    let ask = ProxyAsk {
        agent,
        uri: uri.to_string(),
        headers: request_headers(headers.clone())
            .iter()
            .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
            .collect(),
    };
    let why = match forward.response(&owner, PROXY_PATH, credential, &ask).await {
        Ok(response) if response.headers().contains_key(ANSWERED) => {
            let (mut parts, body) = response.into_parts();
            parts.headers.remove(ANSWERED);
            response_headers(&mut parts.headers);
            return Some(Response::from_parts(parts, Body::new(body)));
        }
        Ok(response) => format!("it answered {}", response.status()),
        Err(e) => format!("{e:?}"),
    };
    tracing::warn!(owner = %owner.advertise_url, agent, reason = %why,
        "proxy: the owner of the agent's connection did not serve the watch; watching here");
    None
}
